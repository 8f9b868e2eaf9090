"""Our simulator against a reference simulator, as whole processes timed side by side (issue 18).

    .venv/bin/python benchmarks/refsim_ratio.py PATH/TO/refsim.py            # writes results/refsim_ratio.json
    .venv/bin/python benchmarks/refsim_ratio.py PATH/TO/refsim.py --repeats 3 --no-record

Ours is `python -m slora_vtc run --suite overload --scheduler vtc --out FILE`; the reference is
`python REFSIM overload vtc 600` (a small pure-Python event loop of the same router semantics, not
part of this repository: its path is an argument). Each is run once untimed first, with Python
allowed to write its bytecode cache (PYTHONDONTWRITEBYTECODE unset), so that both start as an
installed package does, from cached bytecode; then the two alternate, `repeats` times each, and the
ratio is the median wall time of ours over the reference's (CPU times are recorded too). Every
result file ours writes must be byte-identical to the first one; its sha256 is recorded, so a
change of results shows in the recorded file.
"""

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_info

RESULTS = Path(__file__).resolve().parent / "results"
OURS = ("-m", "slora_vtc", "run", "--suite", "overload", "--scheduler", "vtc")
REFERENCE_ARGS = ("overload", "vtc", "600")
TARGET = 0.6  # issue 18: at most 0.6x the reference's time (then aim for 0.3x)
GOAL = 0.3


def timed(command: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def side_by_side(reference: Path, repeats: int, tmp: Path) -> dict:
    """One untimed run of each, then `repeats` alternating timed runs of each."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    first, out = tmp / "first.jsonl", tmp / "ours.jsonl"
    ours = [sys.executable, *OURS, "--out"]
    ref = [sys.executable, str(reference), *REFERENCE_ARGS]
    timed([*ours, str(first)], env)
    timed(ref, env)
    expected = first.read_bytes()
    samples = {"ours": [], "reference": [], "ours_cpu": [], "reference_cpu": []}
    for _ in range(repeats):
        wall, cpu = timed([*ours, str(out)], env)
        if out.read_bytes() != expected:
            raise SystemExit("our result file differs from one run to the next")
        samples["ours"].append(wall)
        samples["ours_cpu"].append(cpu)
        wall, cpu = timed(ref, env)
        samples["reference"].append(wall)
        samples["reference_cpu"].append(cpu)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "ours_s": medians["ours"],
        "reference_s": medians["reference"],
        "ratio": medians["ours"] / medians["reference"],
        "ours_cpu_s": medians["ours_cpu"],
        "reference_cpu_s": medians["reference_cpu"],
        "cpu_ratio": medians["ours_cpu"] / medians["reference_cpu"],
        "min_ratio": min(samples["ours"]) / min(samples["reference"]),  # the least disturbed runs of each
        "samples_s": samples,
        "result_sha256": hashlib.sha256(expected).hexdigest(),
    }


def measure(reference: Path, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        timing = side_by_side(reference, repeats, Path(tmp))
    return {
        "ours": "python " + " ".join(OURS) + " --out FILE",
        "reference": f"python {reference.name} " + " ".join(REFERENCE_ARGS),
        "repeats": repeats,
        "target": TARGET,
        "goal": GOAL,
        **timing,
        "meets_target": timing["ratio"] <= TARGET,
        "machine": machine_info(),
    }


def report(result: dict) -> str:
    return (
        f"ours {result['ours_s']:.3f} s, reference {result['reference_s']:.3f} s (medians of {result['repeats']}): "
        f"ratio {result['ratio']:.2f} (CPU time: {result['cpu_ratio']:.2f}, fastest runs: {result['min_ratio']:.2f}); "
        f"target <= {TARGET}: "
        f"{'met' if result['meets_target'] else 'MISSED'}\nresult file sha256 {result['result_sha256']}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference", type=Path, help="the reference simulator's script (refsim.py)")
    p.add_argument("--repeats", type=int, default=9, help="timed runs of each (default 9; the median counts)")
    p.add_argument("--out", type=Path, default=RESULTS / "refsim_ratio.json")
    p.add_argument("--no-record", action="store_true", help="print only; write nothing")
    args = p.parse_args(argv)
    if not args.reference.is_file():
        p.error(f"{args.reference}: no such file")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    result = measure(args.reference.resolve(), args.repeats)
    print(report(result))
    if not args.no_record:
        previous = json.loads(args.out.read_text()) if args.out.exists() else {}
        if previous.get("result_sha256") not in (None, result["result_sha256"]):
            print(f"note: the result file changed since the last record ({previous['result_sha256']})")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
