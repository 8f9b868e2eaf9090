"""The simulator's calibration, as numbers for the docs (no plot): each testbed's constants, how it
replays its own reference run, what it predicts for the other session's run, the decode knee, and
how many of a measured run's prefill batches it reproduces in order."""

from dataclasses import replace
from pathlib import Path

import numpy as np

import slora_vtc.calibrate as calibration
from slora_vtc.backends.sim import A10G_STEP_MODEL, TESTBEDS, StepTimeModel
from slora_vtc.data import MEASURED
from slora_vtc.figures.base import Figure, Results
from slora_vtc.figures.synthetic import measured_run

REFERENCES = {"a10g-2024": ("vtc_overload.jsonl", "vtc"), "a10g-2023": ("fcfs_overload.jsonl", "fcfs")}
# the model before the latency work: one overhead fitted on the VTC run's whole-run throughput, prompts as recorded
PREVIOUS = replace(A10G_STEP_MODEL, overhead_s=0.0022)


def prefill_batches(result, gap_s: float = 0.005) -> list[int]:
    """Sizes of the prefill batches in order: requests whose first tokens came within gap_s of each other."""
    starts = np.sort(result.array("req_time") + result.array("first_token_latency"))
    cuts = np.flatnonzero(np.diff(starts) > gap_s)
    return np.diff(np.concatenate([[0], cuts + 1, [len(starts)]])).tolist()


def _in_order(ours: list[int], theirs: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))


def _comparison(model: StepTimeModel, file: str, scheduler: str, added_tokens: int = calibration.ADDED_TOKENS) -> dict:
    measured = measured_run(file)
    c = calibration.compare(model, measured, scheduler, added_tokens)
    batches = prefill_batches(measured)
    return {
        "throughput_tok_s": {"measured": round(c.throughput[0], 1), "simulated": round(c.throughput[1], 1)},
        "throughput_error_pct": round(100 * c.throughput_error, 2),
        "ttft_error_pct": {client: round(100 * e, 1) for client, e in c.ttft_errors().items()},
        "largest_ttft_error_pct": round(100 * max(abs(e) for e in c.ttft_errors().values()), 1),
        "share_difference_points": round(100 * max(abs(m - s) for m, s in c.share.values()), 2),
        "prefill_batches": len(batches),
        "prefill_batches_in_order": _in_order(prefill_batches(c.simulated), batches),
    }


# the overload suite's operating point: about 20 running requests, half way through 256 output tokens
OPERATING_POINT = (20, 20 * (257 + 128))


def draw(results: Results, out: Path) -> dict:
    steps = {tb: TESTBEDS[tb].decode_time(*OPERATING_POINT) for tb in REFERENCES}
    numbers = {
        "decode_knee": TESTBEDS["a10g-2024"].decode_knee,
        "decode_step_ms": {tb: round(1000 * t, 2) for tb, t in steps.items()},
        "decode_step_difference_pct": round(100 * (steps["a10g-2023"] / steps["a10g-2024"] - 1), 1),
    }
    for testbed, (file, _scheduler) in REFERENCES.items():
        model = TESTBEDS[testbed]
        numbers[testbed] = {
            "overhead_ms": round(1000 * model.overhead_s, 2),
            "cold_start_s": model.cold_start_s,
            "reference": file,
            "runs": {f: _comparison(model, f, s) for f, s in REFERENCES.values()},
        }
    numbers["previous"] = {
        "overhead_ms": 1000 * PREVIOUS.overhead_s,
        "runs": {f: _comparison(PREVIOUS, f, s, 0) for f, s in REFERENCES.values()},
    }
    return numbers


FIGURES = [
    Figure(
        "calibration",
        "-",
        "the simulator's calibration on the measured runs (numbers only)",
        (),
        draw,
        tuple(f"{MEASURED}/{file}" for file, _ in REFERENCES.values()),
    )
]
