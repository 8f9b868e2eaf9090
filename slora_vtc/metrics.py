"""Fairness and performance metrics, computed as the artifact did (docs/design.md, "Metrics").

A request's service (cost h of its prompt and output) is spread uniformly over [first token,
finish]. Figures, tables, sweeps and the tests use these functions; the table `slora-vtc run`
prints comes from slora_vtc.summary, the same formulas in plain Python (no numpy at start-up).
"""

from collections.abc import Mapping

import numpy as np

from slora_vtc.cost import CostFunction, LinearCost
from slora_vtc.results import RunResult
from slora_vtc.summary import WINDOW_S, FairnessSummary, table_starts


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


def service_rate(
    result: RunResult, ticks, cost: CostFunction = LinearCost(), window: float = WINDOW_S
) -> dict[str, np.ndarray]:
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


def table_windows(horizon: float) -> np.ndarray:
    """Starts of the fairness table's 60 s windows (summary.table_starts), as an array."""
    return np.array(table_starts(horizon))


def fairness_summary(
    result: RunResult,
    horizon: float,
    cost: CostFunction = LinearCost(),
    weights: Mapping[str, float] | None = None,
    offered_cost: CostFunction | None = None,
) -> FairnessSummary:
    """The paper's fairness table: max / avg / variance over windows of sum_i min(max_j s_j - s_i, |o_i - s_i|).

    Exactly as the artifact's plot_revision.py computes it: requests that were never served are
    dropped first (so a rejected request counts as never asked for); the windows are
    [x, x + 60] for x in `table_windows(horizon)`; s_i is client i's service received in the
    window per second (each request's service spread over [first token, finish]); o_i the service
    its requests sent in the window asked for (`offered_cost`, default `cost`; the artifact priced
    it linearly even for the profiled cost). With `weights`, s_i and o_i are divided by w_i.
    """
    served = _served(result)
    clients = [c for c in result.clients if (served & (result.array("client") == c)).any()]
    starts = table_windows(horizon)
    received = np.array([_window_service(result, served, c, starts, cost) for c in clients])
    offered = np.array([_window_offered(result, served, c, starts, offered_cost or cost) for c in clients])
    if weights:
        scale = np.array([weights.get(c, 1.0) for c in clients])[:, None]
        received, offered = received / scale, offered / scale
    if not clients:
        return FairnessSummary(0.0, 0.0, 0.0)
    gap = np.minimum(received.max(axis=0)[None, :] - received, np.abs(offered - received)).sum(axis=0)
    return FairnessSummary(float(gap.max()), float(gap.mean()), float(gap.var()))


def _window_service(
    result: RunResult, served: np.ndarray, client: str, starts: np.ndarray, cost: CostFunction
) -> np.ndarray:
    mine = served & (result.array("client") == client)
    sent = result.array("req_time")[mine]
    begin, end = sent + result.array("first_token_latency")[mine], sent + result.array("request_latency")[mine]
    counted = (end >= 1) & (end - begin >= 1e-5)  # the artifact skips these
    begin, end = begin[counted], end[counted]
    service = cost(result.array("prompt_len")[mine][counted], result.array("output_len")[mine][counted])
    overlap = np.maximum(
        np.minimum(starts[:, None] + WINDOW_S, end[None, :]) - np.maximum(starts[:, None], begin[None, :]), 0.0
    )
    return overlap / (end - begin)[None, :] @ service / WINDOW_S


def _window_offered(
    result: RunResult, served: np.ndarray, client: str, starts: np.ndarray, cost: CostFunction
) -> np.ndarray:
    mine = served & (result.array("client") == client)
    sent = result.array("req_time")[mine]
    asked = cost(result.array("prompt_len")[mine], result.array("output_len")[mine])
    inside = (sent[None, :] >= starts[:, None]) & (sent[None, :] <= starts[:, None] + WINDOW_S)
    return inside @ asked / WINDOW_S


def throughput(result: RunResult) -> float:
    """(prompt + output tokens of served requests) / total time, drain included (tokens/s)."""
    served = _served(result)
    tokens = result.array("prompt_len")[served].sum() + result.array("output_len")[served].sum()
    return float(tokens / result.total_time) if result.total_time > 0 else 0.0


def mean_response_time(result: RunResult, client: str | None = None) -> float:
    """Mean time to first token of the finished requests (of one client, if given); NaN if none."""
    served = _served(result) if client is None else _served(result) & (result.array("client") == client)
    return float(result.array("first_token_latency")[served].mean()) if served.any() else float("nan")


def window_service_rates(
    result: RunResult, start: float, end: float, cost: CostFunction = LinearCost()
) -> dict[str, float]:
    """Service each client received in [start, end], per second."""
    got = accumulated_service(result, [start, end], cost)
    return {c: float(v[1] - v[0]) / (end - start) for c, v in got.items()}


def jain_index(result: RunResult, start: float, end: float, cost: CostFunction = LinearCost()) -> float:
    """Jain's fairness index of the clients' service rates in [start, end]: (sum x)^2 / (n sum x^2),
    1 when all are equal, 1/n when one client gets everything."""
    x = np.array(list(window_service_rates(result, start, end, cost).values()))
    return float(x.sum() ** 2 / (len(x) * (x**2).sum())) if len(x) and (x**2).sum() > 0 else float("nan")


def cache_hit_rate(result: RunResult) -> float:
    """Prompt tokens served from the prefix cache over all prompt tokens prefilled (finished requests;
    a preempted request's later prefills count too)."""
    served = _served(result)
    added = int(result.config.get("added_tokens", 0))
    prefilled = (
        result.array("prompt_len")[served].sum() + added * served.sum() + result.array("recomputed")[served].sum()
    )
    cached = result.array("cached_tokens")[served].sum()
    return float(cached / prefilled) if prefilled else 0.0


# -- a cluster (result files with a replica field) ----------------------------------------
def replica_result(result: RunResult, replica: int) -> RunResult:
    """The responses one replica of a cluster run served, as a result of their own."""
    return RunResult(result.config, result.total_time, tuple(r for r in result.responses if r.replica == replica))


def replica_count(result: RunResult) -> int:
    return int(result.config.get("replicas", 1))


def service_by_client(result: RunResult, cost: CostFunction = LinearCost()) -> dict[str, float]:
    """Total service of each client's finished requests (over every replica)."""
    service = cost(result.array("prompt_len"), result.array("output_len"))
    return {c: float(service[m].sum()) for c, m in _by_client(result, _served(result)).items()}


def tokens_by_replica(result: RunResult) -> list[int]:
    """Prompt + output tokens of the finished requests each replica served."""
    served = _served(result)
    tokens = result.array("prompt_len") + result.array("output_len")
    where = np.array([-1 if r.replica is None else r.replica for r in result.responses])
    return [int(tokens[served & (where == i)].sum()) for i in range(replica_count(result))]


def load_imbalance(result: RunResult) -> float:
    """Max over mean of the tokens served per replica: 1 when even, N when one replica did it all."""
    tokens = tokens_by_replica(result)
    mean = sum(tokens) / len(tokens)
    return max(tokens) / mean if mean else float("nan")


def cache_hit_rate_by_replica(result: RunResult) -> list[float]:
    """Each replica's prefix-cache hit rate (cache_hit_rate of what it served)."""
    return [cache_hit_rate(replica_result(result, i)) for i in range(replica_count(result))]


def latency_by_client(result: RunResult) -> dict[str, float]:
    """Mean time to first token of each client's finished requests."""
    return {c: mean_response_time(result, c) for c in result.clients}
