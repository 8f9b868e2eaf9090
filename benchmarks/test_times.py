"""How long the test tiers take: `make test-fast`'s pytest (every test not marked slow) and, with
--all, the whole suite; wall and CPU time, the counts pytest reports, and the machine.

    .venv/bin/python benchmarks/test_times.py          # the fast tier; writes results/test_times.json
    .venv/bin/python benchmarks/test_times.py --all    # and the whole suite (10-25 minutes on 2 cores)

The fast tier's target (issue 18) is under 3 minutes on a 2-core machine.
"""

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from machine import REPO, machine_info

RESULTS = Path(__file__).resolve().parent / "results"
TIERS = {"fast": ["-m", "not slow"], "all": []}
FAST_TARGET_S = 180.0


def run_tier(args: list[str]) -> dict:
    """One pytest run from the repository root: wall and CPU seconds, and its summary counts."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", summary)}
    if done.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed ({done.returncode}): {summary}")
    return {"wall_s": wall, "cpu_s": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also time the whole suite")
    args = parser.parse_args()
    tiers = ["fast", "all"] if args.all else ["fast"]
    results = {"tiers": {name: run_tier(TIERS[name]) for name in tiers}, "fast_target_s": FAST_TARGET_S}
    results["machine"] = machine_info()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "test_times.json").write_text(json.dumps(results, indent=1) + "\n")
    for name, tier in results["tiers"].items():
        print(f"{name}: {tier['wall_s']:.0f} s wall, {tier['cpu_s']:.0f} s CPU, {tier.get('passed', 0)} passed")


if __name__ == "__main__":
    main()
