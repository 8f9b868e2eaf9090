"""Chunked batching's simulator speed against S-LoRA's loop: wall seconds per simulated request on
the same suites, both loops timed side by side in one process, repeats interleaved (slora, chunked,
slora, ...) so that a busy machine slows both alike, after one untimed run of each; the median of
the repeats. Issue 20 asks for `--batching chunked` to be at least as fast per simulated request as
`--batching slora`.

Beside the times, one more run of each (not among the timed ones) counts the engine's steps, single
and macro alike (its `step()` calls): the events the loop visits in Python. Wall time per request is
events per request times time per event, and the two loops differ in both. That run also times
chunked batching's single steps, which no macro-step can take (they admit, or preempt), against
S-LoRA's whole run (`chunked_single_steps_over_slora`): a floor under the ratio, what it would be if
the macro-steps and the rest of the run cost nothing.

A second table (`pressure` in the results) runs overload under VTC and FCFS with its pool of KV
tokens from the suite's own up to sixteen times as large: how the ratio moves with the preemptions
per request that vLLM's step rule makes (`chunked_preemptions_per_request`, from the chunked run's
requests, and `chunked_preempted_share`, the share preempted at least once; S-LoRA's loop admits
conservatively and never preempts).

    .venv/bin/python benchmarks/chunked_speed.py               # 5 repeats
    .venv/bin/python benchmarks/chunked_speed.py --repeats 9
    .venv/bin/python benchmarks/chunked_speed.py --pressure-repeats 0   # the suites only

Results: benchmarks/results/chunked_speed.json (with the machine they ran on).
"""

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_info  # noqa: E402 (benchmarks/ is not a package)

from slora_vtc import chunked  # noqa: E402
from slora_vtc.chunked import ChunkedBatching  # noqa: E402
from slora_vtc.engine import Engine  # noqa: E402
from slora_vtc.experiment import Experiment  # noqa: E402
from slora_vtc.results import RunResult  # noqa: E402
from slora_vtc.runner import run_experiment  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "chunked_speed.json"
RUNS = (
    ("overload", "vtc", {}),
    ("overload", "fcfs", {}),
    ("dist_shift", "lcf", {}),
    ("real", "vtc", {}),
    ("ablation_65k_256", "vtc", {}),
    ("prefix_chat", "vtc", {"prefix_cache": True}),
)
PRESSURE_POOLS = (10_000, 20_000, 40_000, 80_000, 160_000)  # overload's own pool (10,000 tokens), then larger
PRESSURE_RUNS = tuple(("overload", s, {"pool_tokens": pool}) for s in ("vtc", "fcfs") for pool in PRESSURE_POOLS)
BATCHINGS = ("slora", "chunked")


def timed(exp: Experiment) -> tuple[float, RunResult]:
    start = time.perf_counter()
    result = run_experiment(exp)
    return time.perf_counter() - start, result


def engine_steps(exp: Experiment, batching: str) -> tuple[Counter, Counter]:
    """The engine's events in one run of `exp` (counted around the methods, not in the timed runs),
    by kind: its step() calls under S-LoRA's loop (`step`); under chunked batching, which runs every
    event up to the next arrival in one step() call, its macro-steps (`macro`) and its single steps,
    those that admit from the waiting queue (`admitting`), those that preempt (`preempting`: such a
    step admits nothing) and the others (`other`: a prefill's next chunk, decodes the macro-steps
    could not take). Returns the counts, and the wall seconds of the single steps by kind (each
    timed from its scheduling to its end)."""
    kinds: Counter = Counter()
    seconds: Counter = Counter()
    last = ["other"]  # the kind of the single step being timed, told by its plan

    def counted(original, kind):
        def call(*args):
            result = original(*args)
            last[0] = kind(result)
            kinds[last[0]] += 1
            return result

        return call

    def timed_step(original):
        def call(*args):
            start = time.perf_counter()
            result = original(*args)
            seconds[last[0]] += time.perf_counter() - start
            return result

        return call

    def single(plan) -> str:
        return "admitting" if plan.started else "preempting" if plan.preempted else "other"

    patched = [(Engine, "step", counted(Engine.step, lambda _: "step"))] if batching == "slora" else [
        (ChunkedBatching, "_schedule", counted(ChunkedBatching._schedule, single)),
        (ChunkedBatching, "_single_step", timed_step(ChunkedBatching._single_step)),
        (chunked, "decode_ahead", counted(chunked.decode_ahead, lambda _: "macro"))]  # fmt: skip
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, wrapped in patched:
        setattr(owner, name, wrapped)
    try:
        run_experiment(exp)
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    return kinds, seconds


def measure(runs: tuple, repeats: int) -> list[dict]:
    rows = []
    for suite, scheduler, extra in runs:
        samples: dict[str, list[float]] = {b: [] for b in BATCHINGS}
        results: dict[str, RunResult] = {}
        exps = {b: Experiment.of(suite=suite, scheduler=scheduler, batching=b, **extra) for b in BATCHINGS}
        for exp in exps.values():  # untimed: the suite's data loaded and the code warm before either is timed
            run_experiment(exp)
        for _ in range(repeats):
            for batching, exp in exps.items():
                wall_s, results[batching] = timed(exp)
                samples[batching].append(wall_s)
        preemptions = results["chunked"].array("preemptions")
        requests = len(preemptions)
        row = {"suite": suite, "scheduler": scheduler, **extra, "requests": requests}
        row["chunked_preemptions_per_request"] = float(preemptions.mean())
        row["chunked_preempted_share"] = float((preemptions > 0).mean())
        for batching in BATCHINGS:
            row[f"{batching}_ms_per_request"] = 1000 * statistics.median(samples[batching]) / requests
            row[f"{batching}_samples_s"] = [round(s, 4) for s in samples[batching]]
        row["chunked_over_slora"] = row["chunked_ms_per_request"] / row["slora_ms_per_request"]
        single_seconds: dict[str, Counter] = {}  # by batching: only chunked batching's single steps are timed
        for batching, exp in exps.items():
            kinds, single_seconds[batching] = engine_steps(exp, batching)
            steps = sum(kinds.values())
            row[f"{batching}_steps_per_request"] = steps / requests
            row[f"{batching}_steps_per_request_by_kind"] = {k: n / requests for k, n in sorted(kinds.items())}
            row[f"{batching}_us_per_step"] = 1000 * row[f"{batching}_ms_per_request"] * requests / steps
        single_ms = {k: 1000 * s / requests for k, s in sorted(single_seconds["chunked"].items())}
        row["chunked_single_steps_ms_per_request_by_kind"] = single_ms
        row["chunked_single_steps_over_slora"] = sum(single_ms.values()) / row["slora_ms_per_request"]
        rows.append(row)
        print(
            f"{suite:18s} {scheduler:6s} {extra.get('pool_tokens', '')!s:>6s} {requests:6d} requests  "
            f"slora {row['slora_ms_per_request']:.3f} ms/req  "
            f"chunked {row['chunked_ms_per_request']:.3f} ms/req  ratio {row['chunked_over_slora']:.2f}  "
            f"steps/req {row['slora_steps_per_request']:.2f} : {row['chunked_steps_per_request']:.2f}  "
            f"us/step {row['slora_us_per_step']:.0f} : {row['chunked_us_per_step']:.0f}  "
            f"single steps / slora {row['chunked_single_steps_over_slora']:.2f}",
            flush=True,
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="of each suite's runs")
    p.add_argument("--pressure-repeats", type=int, default=3, help="of each pool's runs (0: none)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.pressure_repeats < 0:
        p.error("--repeats must be at least 1 and --pressure-repeats at least 0")
    out = {"machine": machine_info(), "repeats": args.repeats, "runs": measure(RUNS, args.repeats)}
    if args.pressure_repeats:
        out["pressure_repeats"] = args.pressure_repeats
        out["pressure"] = measure(PRESSURE_RUNS, args.pressure_repeats)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
