"""What `slora-vtc run` prints for a run (the paper's fairness table, throughput, mean time to first
token), computed in plain Python.

slora_vtc.metrics computes the same with numpy, for the figures and sweeps. Here a run's start-up
imports no numpy (importing it took about as long as simulating the overload suite), and a table
of one run needs no vectors: each request adds its service to the few windows it overlaps. The
formulas are metrics.fairness_summary's, throughput's and mean_response_time's; only the order of
the floating-point sums differs, so values agree to about 1e-12 relative (tests/sim/test_summary.py
checks them against metrics on every suite).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

from slora_vtc.cost import CostFunction, LinearCost
from slora_vtc.results import Response, RunResult

WINDOW_S = 60.0
WARMUP_S = 30.0
TABLE_WINDOWS = 20  # the artifact cuts (horizon - warm-up) into 20 parts and starts a window at each inner cut


@dataclass(frozen=True)
class FairnessSummary:
    max: float
    avg: float
    var: float


def table_starts(horizon: float) -> list[float]:
    """Starts of the fairness table's 60 s windows: (horizon - 30) / 20 * i for i = 1..19."""
    return [(horizon - WARMUP_S) / TABLE_WINDOWS * i for i in range(1, TABLE_WINDOWS)]


def fairness(
    result: RunResult,
    horizon: float,
    cost: CostFunction = LinearCost(),
    weights: Mapping[str, float] | None = None,
    offered_cost: CostFunction | None = None,
) -> FairnessSummary:
    """metrics.fairness_summary: per window, sum_i min(max_j s_j - s_i, |o_i - s_i|) over the
    clients with a finished request; its max, mean and variance over the windows."""
    starts = table_starts(horizon)
    served = [r for r in result.responses if r.status == "finished"]
    clients = [c for c in result.clients if any(r.client == c for r in served)]
    if not clients:
        return FairnessSummary(0.0, 0.0, 0.0)
    received, offered = [], []
    for client in clients:
        mine = [r for r in served if r.client == client]
        scale = weights.get(client, 1.0) if weights else 1.0
        received.append([s / scale for s in _window_service(mine, starts, cost)])
        offered.append([o / scale for o in _window_offered(mine, starts, offered_cost or cost)])
    gaps = []
    for k in range(len(starts)):
        most = max(row[k] for row in received)
        gaps.append(sum(min(most - s[k], abs(o[k] - s[k])) for s, o in zip(received, offered)))
    mean = math.fsum(gaps) / len(gaps)
    return FairnessSummary(max(gaps), mean, math.fsum((g - mean) ** 2 for g in gaps) / len(gaps))


def _window_service(mine: list[Response], starts: list[float], cost: CostFunction) -> list[float]:
    """Service received in each window, per second: each request's spread over [first token, finish]."""
    totals = [0.0] * len(starts)
    for r in mine:
        begin, end = r.req_time + r.first_token_latency, r.req_time + r.request_latency
        if end < 1 or end - begin < 1e-5:  # the artifact skips these
            continue
        service = cost(r.prompt_len, r.output_len)
        for k in _windows(begin - WINDOW_S, end, starts):
            start = starts[k]
            overlap = (start + WINDOW_S if start + WINDOW_S < end else end) - (start if start > begin else begin)
            if overlap > 0:
                totals[k] += overlap / (end - begin) * service
    return [t / WINDOW_S for t in totals]


def _window_offered(mine: list[Response], starts: list[float], cost: CostFunction) -> list[float]:
    """Service asked for by the requests sent in each window [start, start + 60], per second."""
    totals = [0.0] * len(starts)
    for r in mine:
        sent, asked = r.req_time, cost(r.prompt_len, r.output_len)
        for k in _windows(sent - WINDOW_S, sent, starts):
            if starts[k] <= sent <= starts[k] + WINDOW_S:
                totals[k] += asked
    return [t / WINDOW_S for t in totals]


def _windows(lo: float, hi: float, starts: list[float]) -> range:
    """Indices of the windows whose start may lie in [lo, hi] (starts[k] = step * (k + 1)): a
    superset, a window wider on each side, for the caller's exact test."""
    step = starts[0]
    if step <= 0:
        return range(len(starts))
    return range(max(0, math.floor(lo / step) - 2), min(len(starts), math.ceil(hi / step) + 1))


def throughput(result: RunResult) -> float:
    """(prompt + output tokens of served requests) / total time, drain included (tokens/s)."""
    tokens = sum(r.prompt_len + r.output_len for r in result.responses if r.status == "finished")
    return tokens / result.total_time if result.total_time > 0 else 0.0


def mean_response_time(result: RunResult) -> float:
    """Mean time to first token of the finished requests; NaN if none."""
    latencies = [r.first_token_latency for r in result.responses if r.status == "finished"]
    return math.fsum(latencies) / len(latencies) if latencies else float("nan")
