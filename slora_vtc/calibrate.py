"""Calibrate the simulator to a testbed: the forward pass from a cost profile, what the serving
path adds from one measured run of it (docs/design.md, "The simulator and its calibration").

The profile times the model's forward pass alone. A served run adds, per forward pass, the
host's work around it (sampling, tensor copies, synchronisation, IPC): the `overhead`, fitted so
that the simulator serves the measured run's own requests at the measured steady-state rate
(tokens per second while the server is backlogged, which the drain at the end does not disturb).
The artifact's server does no warm-up, so its first forward pass also pays one-time start-up
costs: `cold_start`, measured as the first request's time to first token beyond the model's.
Everything else (throughput, latencies, service shares of other runs) is then a prediction.
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from slora_vtc import metrics
from slora_vtc.backends.sim import SimBackend, StepTimeModel
from slora_vtc.config import EngineConfig
from slora_vtc.cost import LinearCost
from slora_vtc.errors import UserError
from slora_vtc.results import RunResult, read_results
from slora_vtc.runner import serve_requests
from slora_vtc.sched import build_scheduler
from slora_vtc.workload import workload_from_result

STEADY_FROM_S = 100.0  # the steady-state window starts here...
STEADY_UNTIL = 0.8  # ...and ends at this fraction of the measured run's total time, before the drain
ADDED_TOKENS = 1  # the artifact's client sends prompt_len words; its server adds a BOS token
MIN_REQUESTS = 20  # per-client latency is compared for clients with at least this many requests
TOKENS = LinearCost(1.0, 1.0)  # prompt + output tokens, to measure a steady-state token rate


def replay(
    model: StepTimeModel,
    measured: RunResult,
    scheduler: str,
    pool_tokens: int = 10_000,
    added_tokens: int = ADDED_TOKENS,
) -> RunResult:
    """The measured run's own requests (clients, lengths, send times) served by the simulator."""
    workload = workload_from_result("measured", measured)
    requests = workload.requests(added_tokens)
    total = serve_requests(
        requests,
        build_scheduler(scheduler, list(workload.clients)),
        EngineConfig(pool_tokens=pool_tokens),
        SimBackend(model),
    )
    return RunResult.of({"duration": workload.duration}, requests, total)


def steady_rate(result: RunResult, until: float) -> float:
    """Prompt + output tokens served per second in [STEADY_FROM_S, until]."""
    served = metrics.accumulated_service(result, [STEADY_FROM_S, until], TOKENS)
    return float(sum(s[1] - s[0] for s in served.values()) / (until - STEADY_FROM_S))


def measure_cold_start(model: StepTimeModel, measured: RunResult, scheduler: str) -> float:
    """How much longer the measured first request took to its first token than the model says."""
    warm = replay(replace(model, cold_start_s=0.0), measured, scheduler)
    first = int(np.argmin(measured.array("req_time")))
    return max(0.0, float(measured.array("first_token_latency")[first] - warm.array("first_token_latency")[first]))


def fit_overhead(model: StepTimeModel, measured: RunResult, scheduler: str, tolerance_s: float = 1e-5) -> float:
    """The per-forward-pass overhead at which the simulated steady-state rate is the measured one."""
    until = STEADY_UNTIL * measured.total_time
    target = steady_rate(measured, until)
    lo, hi = 0.0, 0.02
    if steady_rate(replay(replace(model, overhead_s=lo), measured, scheduler), until) <= target:
        return 0.0
    while hi - lo > tolerance_s:  # the rate falls as the overhead grows
        mid = (lo + hi) / 2
        if steady_rate(replay(replace(model, overhead_s=mid), measured, scheduler), until) > target:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 5)


def calibrate(model: StepTimeModel, reference: RunResult, scheduler: str) -> StepTimeModel:
    """The forward-pass model plus what the reference run says the serving path adds."""
    if reference.total_time * STEADY_UNTIL <= STEADY_FROM_S:
        raise UserError(
            f"the run to calibrate on (the first --measured) lasted {reference.total_time:g} s; its steady state, "
            f"from {STEADY_FROM_S:g} s to {STEADY_UNTIL:g} x its total_time, is empty: give a run longer than "
            f"{STEADY_FROM_S / STEADY_UNTIL:g} s (or --testbed)"
        )
    cold = round(measure_cold_start(model, reference, scheduler), 2)
    overhead = fit_overhead(replace(model, cold_start_s=cold), reference, scheduler)
    return replace(model, overhead_s=overhead, cold_start_s=cold)


@dataclass(frozen=True)
class Comparison:
    """A measured run against the simulator serving its requests."""

    throughput: tuple[float, float]  # tokens/s: measured, simulated
    ttft: dict[str, tuple[float, float]]  # per client with >= MIN_REQUESTS requests: mean TTFT measured, simulated
    share: dict[str, tuple[float, float]]  # per client: share of the service delivered by the end of arrivals
    simulated: RunResult  # the simulator's run of the measured requests

    @property
    def throughput_error(self) -> float:
        return self.throughput[1] / self.throughput[0] - 1

    def ttft_errors(self) -> dict[str, float]:
        return {c: s / m - 1 for c, (m, s) in self.ttft.items()}


def compare(model: StepTimeModel, measured: RunResult, scheduler: str, added_tokens: int = ADDED_TOKENS) -> Comparison:
    simulated = replay(model, measured, scheduler, added_tokens=added_tokens)
    duration = float(measured.config.get("duration", measured.array("req_time").max()))
    return Comparison(
        (metrics.throughput(measured), metrics.throughput(simulated)),
        {
            c: (metrics.mean_response_time(measured, c), metrics.mean_response_time(simulated, c))
            for c in measured.clients
            if (measured.array("client") == c).sum() >= MIN_REQUESTS
        },
        {c: (m, s) for c, m, s in zip(measured.clients, *(_shares(r, duration) for r in (measured, simulated)))},
        simulated,
    )


def _shares(result: RunResult, until: float) -> list[float]:
    served = metrics.accumulated_service(result, [until])
    total = sum(s[0] for s in served.values())
    return [float(served[c][0] / total) for c in result.clients]


def first_run(path: str) -> RunResult:
    """The first run of a measured result file, checked for what calibrating on it and comparing with it need."""
    runs = read_results(path)
    if not runs:
        raise UserError(f"{path}: no run in this result file (it is empty)")
    run = runs[0]
    if not run.responses:
        raise UserError(
            f"{path}: the first run has no responses (field 'responses' is []); a measured run's requests are needed"
        )
    if not any(r.status == "finished" for r in run.responses):
        raise UserError(
            f"{path}: the first run served no request (none of its {len(run.responses)} responses finished)"
        )
    if run.total_time <= 0:
        raise UserError(f"{path}: the first run's field 'total_time' must be positive, got {run.total_time}")
    duration = run.config.get("duration", 1.0)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 < duration < math.inf:
        raise UserError(
            f"{path}: the first run's field 'config.duration' must be a positive number of seconds, got {duration!r}"
        )
    return run
