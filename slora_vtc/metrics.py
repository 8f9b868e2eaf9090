"""Fairness and performance metrics, computed as the artifact did (DESIGN section 7).

A request's service (cost h of its prompt and output) is spread uniformly over [first token,
finish]. Figures, tables, the CLI and the tests all use these functions.
"""

from dataclasses import dataclass

import numpy as np

from slora_vtc.cost import CostFunction, LinearCost
from slora_vtc.results import RunResult

WINDOW_S = 60.0
WARMUP_S = 30.0
TABLE_TICKS = 20


def _served(result: RunResult) -> np.ndarray:
    return result.array("status") == "finished"


def _by_client(result: RunResult, mask: np.ndarray) -> dict[str, np.ndarray]:
    clients = result.array("client")
    return {c: mask & (clients == c) for c in result.clients}


def accumulated_service(result: RunResult, ticks, cost: CostFunction = LinearCost()) -> dict[str, np.ndarray]:
    """Service each client has received by each tick."""
    ticks = np.asarray(ticks, dtype=float)
    t0 = result.array("req_time")
    start = t0 + result.array("first_token_latency")
    span = np.maximum(result.array("request_latency") - result.array("first_token_latency"), 1e-9)
    service = cost(result.array("prompt_len"), result.array("output_len"))
    out = {}
    for client, mask in _by_client(result, _served(result)).items():
        done = np.clip((ticks[:, None] - start[mask][None, :]) / span[mask][None, :], 0.0, 1.0)
        out[client] = done @ service[mask]
    return out


def service_rate(result: RunResult, ticks, cost: CostFunction = LinearCost(), window: float = WINDOW_S) -> dict[str, np.ndarray]:
    """Service received in a window centred on each tick, per second."""
    ticks = np.asarray(ticks, dtype=float)
    hi = accumulated_service(result, ticks + window / 2, cost)
    lo = accumulated_service(result, ticks - window / 2, cost)
    return {c: (hi[c] - lo[c]) / window for c in hi}


def response_time(result: RunResult, ticks, window: float = WINDOW_S) -> dict[str, np.ndarray]:
    """Mean time to first token of requests sent in a window centred on each tick (NaN: none)."""
    ticks = np.asarray(ticks, dtype=float)
    sent = result.array("req_time")
    latency = result.array("first_token_latency")
    out = {}
    for client, mask in _by_client(result, _served(result)).items():
        inside = np.abs(sent[mask][None, :] - ticks[:, None]) <= window / 2
        count = inside.sum(axis=1)
        total = inside @ latency[mask]
        out[client] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return out


def service_difference(result: RunResult, ticks, cost: CostFunction = LinearCost()) -> np.ndarray:
    """Absolute difference of accumulated service: max minus min over clients, per tick."""
    service = np.array(list(accumulated_service(result, ticks, cost).values()))
    return service.max(axis=0) - service.min(axis=0)


def synthetic_ticks(duration: float, per: int = 30) -> np.ndarray:
    return np.linspace(0, duration, per + 1)


@dataclass(frozen=True)
class FairnessSummary:
    max: float
    avg: float
    var: float


def fairness_summary(result: RunResult, duration: float, cost: CostFunction = LinearCost()) -> FairnessSummary:
    """Max / avg / variance over ticks of sum_i min(max_j s_j - s_i, |offered_i - s_i|).

    s_i: client i's service rate in [t, t + 60]; offered_i: the service its requests sent in that
    window asked for. Ticks every (duration - 30) / 20 s after a 30 s warm-up. A client that got
    less because it asked for less is not counted as treated unfairly.
    """
    ticks = WARMUP_S + np.arange(TABLE_TICKS) * (duration - WARMUP_S) / TABLE_TICKS
    lo = accumulated_service(result, ticks, cost)
    hi = accumulated_service(result, ticks + WINDOW_S, cost)
    received = np.array([(hi[c] - lo[c]) / WINDOW_S for c in result.clients])
    offered = np.array([_offered(result, c, ticks, cost) for c in result.clients])
    gap = np.minimum(received.max(axis=0)[None, :] - received, np.abs(offered - received)).sum(axis=0)
    return FairnessSummary(float(gap.max()), float(gap.mean()), float(gap.var()))


def _offered(result: RunResult, client: str, ticks: np.ndarray, cost: CostFunction) -> np.ndarray:
    mine = result.array("client") == client
    sent = result.array("req_time")[mine]
    asked = cost(result.array("prompt_len")[mine], result.array("output_len")[mine])
    inside = (sent[None, :] >= ticks[:, None]) & (sent[None, :] < ticks[:, None] + WINDOW_S)
    return inside @ asked / WINDOW_S


def throughput(result: RunResult) -> float:
    """(prompt + output tokens of served requests) / total time, drain included (tokens/s)."""
    served = _served(result)
    tokens = result.array("prompt_len")[served].sum() + result.array("output_len")[served].sum()
    return float(tokens / result.total_time) if result.total_time > 0 else 0.0


def mean_response_time(result: RunResult) -> float:
    served = _served(result)
    return float(result.array("first_token_latency")[served].mean()) if served.any() else float("nan")
