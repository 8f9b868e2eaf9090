"""Calibrate the simulator: step times from a cost profile, serving overhead from one measured run.

The profile times the model's forward pass; a served system adds a roughly constant time to each
forward pass. We find the overhead that makes the simulator's throughput on the measured run's own
requests match the measured throughput (bisection; throughput falls as overhead grows), then check
it against other measured runs.
"""

from dataclasses import dataclass, replace

from pathlib import Path

from slora_vtc import metrics
from slora_vtc.backends.sim import SimBackend, StepTimeModel
from slora_vtc.config import EngineConfig
from slora_vtc.data import A10G_PROFILE, MEASURED, data_file
from slora_vtc.errors import UserError
from slora_vtc.experiment import serve_requests
from slora_vtc.profile import load_profile
from slora_vtc.results import RunResult, read_results
from slora_vtc.sched import build_scheduler
from slora_vtc.workload import workload_from_result


@dataclass(frozen=True)
class Replay:
    measured: float  # tokens/s
    simulated: float  # tokens/s

    @property
    def error(self) -> float:
        return (self.simulated - self.measured) / self.measured


def replay(model: StepTimeModel, measured: RunResult, scheduler: str, pool_tokens: int = 10_000) -> Replay:
    """Serve a measured run's requests on the simulator and compare throughputs."""
    workload = workload_from_result("measured", measured)
    requests = workload.requests()
    total = serve_requests(requests, build_scheduler(scheduler, list(workload.clients)), EngineConfig(pool_tokens=pool_tokens), SimBackend(model))
    simulated = RunResult.of({}, requests, total)
    return Replay(metrics.throughput(measured), metrics.throughput(simulated))


def fit_overhead(model: StepTimeModel, measured: RunResult, scheduler: str, tolerance: float = 1e-4) -> float:
    """The per-forward-pass overhead (s) at which the simulator matches the measured throughput."""
    lo, hi = 0.0, 0.05
    if replay(replace(model, overhead_s=lo), measured, scheduler).error <= 0:
        return 0.0
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        if replay(replace(model, overhead_s=mid), measured, scheduler).error > 0:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


def _first_run(path: str) -> RunResult:
    runs = read_results(path)
    if not runs:
        raise UserError(f"{path}: no run in this result file (it is empty)")
    return runs[0]


def _guess_scheduler(path: str) -> str:
    stem = Path(path).stem.split("_")[0]
    return stem if stem in ("vtc", "fcfs", "lcf") else "vtc"


def calibration_report(profile: str | None, measured: list[str], schedulers: list[str]) -> str:
    """Fit, residuals, the overhead fitted on the first measured run, and every replay's error."""
    import pandas as pd

    profile = profile or data_file(A10G_PROFILE)
    if not measured:
        found = sorted(data_file(MEASURED).glob("*.jsonl"), key=lambda p: (not p.name.startswith("vtc"), p.name))
        measured = [str(p) for p in found]
    schedulers = list(schedulers) + [_guess_scheduler(m) for m in measured[len(schedulers):]]
    points = load_profile(profile)
    model = StepTimeModel.fit(points)
    lines = [f"profile: {profile}", "forward-pass model (seconds):",
             f"  prefill = {model.prefill_coef[0]:.5f} + {model.prefill_coef[1]:.3e} * requests + {model.prefill_coef[2]:.3e} * prompt_tokens",
             f"  decode  = {model.decode_coef[0]:.5f} + {model.decode_coef[1]:.3e} * max(0, requests - {model.decode_knee}) + {model.decode_coef[2]:.3e} * context_tokens"]
    table = pd.DataFrame([{"input": p.input_len, "output": p.output_len, "batch": p.batch_size,
                           "prefill_err_%": 100 * e_p, "decode_err_%": 100 * e_d} for p, e_p, e_d in model.residuals(points)])
    lines += ["relative residuals per profile point:", table.to_string(index=False, float_format="%.1f"),
              f"rms: prefill {(table['prefill_err_%'] ** 2).mean() ** 0.5:.1f}%, decode {(table['decode_err_%'] ** 2).mean() ** 0.5:.1f}%"]
    if measured:
        runs = [_first_run(m) for m in measured]
        overhead = fit_overhead(model, runs[0], schedulers[0])
        model = replace(model, overhead_s=overhead)
        lines.append(f"serving overhead per forward pass, fitted on {measured[0]}: {overhead * 1000:.1f} ms")
        for path, run, sched in zip(measured, runs, schedulers):
            r = replay(model, run, sched)
            lines.append(f"  replay {path} ({sched}): measured {r.measured:.1f} tok/s, simulated {r.simulated:.1f} tok/s ({r.error:+.1%})")
    return "\n".join(lines)
