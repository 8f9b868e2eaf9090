"""A step log of real vLLM, to calibrate the simulator from (`slora-vtc calibrate --vllm-steps`).

Starts vLLM (with the plugin, `vtc`, and `"step_log"`) on the tiny random Llama of tests/vllm, sends
it a load whose steps cover what the step-time model must tell apart (docs/vllm.md, "Calibrating
the simulator from vLLM's steps"): requests from two tenants, prompt lengths drawn uniformly in
[16, 1500] (long prompts are prefilled in several chunks of the token budget), outputs in [8, 200]
(`ignore_eos`); first Poisson arrivals for `--seconds` (mostly small batches, the engine sometimes
idle), then closed loops keeping 4, 8 and 16 requests in flight (`--closed`), each for
`--closed-seconds`, so that decode batches of every size up to `--max-num-seqs` run beside prefill
chunks. Writes the step log and a summary beside it (machine, settings, requests, load average).

    .venv-vllm/bin/python benchmarks/vllm_steps.py --out steps.jsonl [--model-dir DIR] [--rate 3]
    .venv/bin/python benchmarks/vllm_steps.py --analyse NAME=steps.jsonl [NAME=...]

`--analyse` reads step logs (each with its summary beside it) and writes what docs/vllm.md quotes to
benchmarks/results/vllm_steps.json: per log the steps' times, the fit `slora-vtc calibrate
--vllm-steps` makes and a least-squares fit beside it; across logs, how each log's fitted shape
times the other's steps, and how its model predicts the other's measured time.
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from machine import machine_info  # noqa: E402

from tests.vllm.load import Served, client, complete, prompt  # noqa: E402
from tests.vllm.model import build_tiny_llama  # noqa: E402
from tests.vllm.server import VllmServer, plugin_args  # noqa: E402

PROMPT_LENS, OUTPUT_LENS = (16, 1500), (8, 200)
RESULTS = REPO / "benchmarks" / "results" / "vllm_steps.json"
KINDS = ("prefill only", "mixed", "decode only")
EXTRA_TERMS = ("prefill_reqs", "kv_tokens")  # in the log, left out of the model


class Load:
    """Requests of random lengths from two tenants, sent open-loop or by closed loops."""

    def __init__(self, url: str, seed: int):
        self.api, self.rng = client(url), random.Random(seed)
        self.served = {tenant: Served() for tenant in ("a", "b")}
        self.errors: list[str] = []

    async def one(self) -> None:
        tenant = self.rng.choice("ab")
        ids, tokens = prompt(self.rng, self.rng.randint(*PROMPT_LENS)), self.rng.randint(*OUTPUT_LENS)
        try:
            await complete(self.api, tenant, ids, tokens, self.served[tenant])
        except Exception as e:  # noted and reported; the log is what matters
            self.errors.append(repr(e))

    async def poisson(self, rate: float, seconds: float) -> None:
        tasks, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            tasks.append(asyncio.create_task(self.one()))
            await asyncio.sleep(self.rng.expovariate(rate))
        await asyncio.gather(*tasks)

    async def closed(self, in_flight: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                await self.one()

        await asyncio.gather(*(worker() for _ in range(in_flight)))


async def load(url: str, rate: float, seconds: float, closed: list[int], closed_s: float, seed: int) -> Load:
    """Poisson arrivals for `seconds`, then a closed loop of each size in `closed` for `closed_s` each."""
    sender = Load(url, seed)
    await sender.poisson(rate, seconds)
    for in_flight in closed:
        await sender.closed(in_flight, closed_s)
    await sender.api.close()
    if sender.errors:
        print(f"{len(sender.errors)} requests failed, the first: {sender.errors[0]}", file=sys.stderr)
    return sender


def analyse(logs: dict[str, Path]) -> dict:
    """Per log: its steps' times and both fits. Across logs (a -> b), for each way of fitting: log a's
    fitted shape on log b's steps, scaled to b's measured wall time, per kind of step (relative
    error); its median error per step unscaled; and a's model (with its slowdown) on b's wall time."""
    import numpy as np

    from slora_vtc.calibrate_steps import (
        TERMS,
        _kind,
        _least_absolute_deviations,
        _least_squares_nonnegative,
        fit_steps,
    )
    from slora_vtc.steplog import read_step_log

    steps = {name: [r for r in read_step_log(path) if r.prefill_tokens or r.decode_reqs] for name, path in logs.items()}
    X = {name: np.array([[1.0, *(getattr(r, t) for t in TERMS)] for r in rs]) for name, rs in steps.items()}
    y = {name: np.array([r.wall_s for r in rs]) for name, rs in steps.items()}
    kinds = {name: np.array([_kind(r) for r in rs]) for name, rs in steps.items()}
    fitters = {"median": _least_absolute_deviations, "least_squares": _least_squares_nonnegative}
    shapes = {method: {name: fit(X[name], y[name]) for name in steps} for method, fit in fitters.items()}
    out = {"logs": {}, "cross": {}}
    for name, records in steps.items():
        fit, gap = fit_steps(records), np.array([r.gap_s for r in records])
        out["logs"][name] = {
            "summary": json.loads(logs[name].with_suffix(".json").read_text()),
            "steps": len(records),
            "seconds": float(y[name].sum() + gap.sum()),
            "steps_of_kind": {k: v[0] for k, v in fit.by_kind.items()},
            "max_decode_reqs": max(r.decode_reqs for r in records),
            "wall_ms": {q: 1e3 * float(np.quantile(y[name], float(q))) for q in ("0.5", "0.9", "0.99")}
            | {"max": 1e3 * float(y[name].max())},
            "gap_ms": {
                "median": 1e3 * float(np.median(gap)),
                "busy_mean": 1e3 * fit.model.gap_s,
                "max": 1e3 * float(gap.max()),
            },  # fmt: skip
            "fit": {
                **{k: v for k, v in fit.model.to_json().items() if k != "kind"},
                "slowdown": fit.slowdown,
                "median_error": fit.median_error,
            },  # fmt: skip
            "fit_by_kind": {k: v[2] / v[1] - 1 for k, v in fit.by_kind.items()},
            "least_squares": dict(
                zip(["base_s", *(f"{t}_s" for t in TERMS)], map(float, shapes["least_squares"][name]))
            ),
            "median_error_with": {term: _median_error_with(X[name], y[name], records, term) for term in EXTRA_TERMS},
            "decode_only_median_ms": {
                str(n): 1e3
                * float(np.median([r.wall_s for r in records if not r.prefill_tokens and r.decode_reqs == n]))
                for n in sorted({r.decode_reqs for r in records if not r.prefill_tokens})
            },
        }
    for method in fitters:
        for a in steps:
            for b in steps:
                raw = X[b] @ shapes[method][a]
                scaled = raw * y[b].sum() / raw.sum()
                scale_a = y[a].sum() / (X[a] @ shapes[method][a]).sum()
                out["cross"].setdefault(method, {})[f"{a}->{b}"] = {
                    "kinds": {k: float(scaled[kinds[b] == k].sum() / y[b][kinds[b] == k].sum() - 1) for k in KINDS},
                    "median_step_error": float(np.median(np.abs(raw - y[b]) / y[b])),
                    "wall": float((raw * scale_a).sum() / y[b].sum() - 1),
                }
    return out


def _median_error_with(X, y, records, term: str) -> float:
    """The median fit's median error per step with one more term of the log."""
    import numpy as np

    from slora_vtc.calibrate_steps import _least_absolute_deviations

    wider = np.column_stack([X, [getattr(r, term) for r in records]])
    return float(np.median(np.abs(wider @ _least_absolute_deviations(wider, y) - y) / y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--analyse", nargs="+", metavar="NAME=LOG", help="analyse these logs instead of running")
    parser.add_argument("--out", help="where the step log is copied")
    parser.add_argument("--model-dir", help="a tiny model folder (default: built in a temporary folder)")
    parser.add_argument("--rate", type=float, default=3.0, help="requests per second of the open loop")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the open loop sends")
    parser.add_argument("--closed", default="4,8,16", help="sizes of the closed loops after it")
    parser.add_argument("--closed-seconds", type=float, default=12.0, help="how long each closed loop runs")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.analyse:
        logs = {name: Path(path) for name, _, path in (item.partition("=") for item in args.analyse)}
        RESULTS.write_text(json.dumps(analyse(logs), indent=1) + "\n")
        print(f"wrote {RESULTS}")
        return
    if not args.out:
        parser.error("--out is needed to run vLLM")
    model = Path(args.model_dir) if args.model_dir else build_tiny_llama(Path(tempfile.mkdtemp()) / "tiny")
    log = Path(tempfile.mkdtemp()) / "steps.jsonl"
    settings = ["--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens",
                str(args.max_num_batched_tokens), "--max-model-len", "2048"]  # fmt: skip
    config = {"scheduler": "vtc", "step_log": str(log)}
    with VllmServer(model, [*settings, *plugin_args(config)], env={"PYTHONPATH": str(REPO)}) as server:
        started, load_before = time.monotonic(), os.getloadavg()[0]
        closed = [int(k) for k in args.closed.split(",") if k]
        sent = asyncio.run(load(server.url, args.rate, args.seconds, closed, args.closed_seconds, args.seed))
        elapsed = time.monotonic() - started
    shutil.copyfile(log, args.out)
    summary = {
        "machine": machine_info(),
        "settings": {**vars(args), "vllm_args": settings},
        "requests": sum(len(s.usages) for s in sent.served.values()),
        "failed": len(sent.errors),
        "output_tokens": sum(y for s in sent.served.values() for _, y in s.usages),
        "prompt_tokens": sum(x for s in sent.served.values() for x, _ in s.usages),
        "load_s": elapsed,
        "loadavg_1m": [load_before, os.getloadavg()[0]],
    }
    Path(args.out).with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "machine"}))


if __name__ == "__main__":
    main()
