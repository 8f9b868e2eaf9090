"""A figure: the experiments it needs and how to draw them; plus numbers for paper_repro.md."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slora_vtc import metrics
from slora_vtc.cost import CostFunction, LinearCost
from slora_vtc.experiment import Experiment
from slora_vtc.results import RunResult

Results = dict[Experiment, RunResult]


@dataclass(frozen=True)
class Figure:
    name: str
    paper_figure: str  # arXiv v2 numbering; "-" for figures beyond the paper
    title: str
    experiments: tuple[Experiment, ...]
    draw: Callable[[Results, Path], dict]  # writes out/<name>.png, returns the numbers it shows
    inputs: tuple[str, ...] = ()  # shipped data files it reads (slora_vtc.data), checked before anything runs


TABLE_HORIZON_S = 600.0  # the artifact's fairness tables cut every run at 600 s, the 360 s ones too


def run_numbers(
    result: RunResult, duration: float, cost: CostFunction = LinearCost(), weights: dict[str, float] | None = None
) -> dict:
    """The numbers paper_repro.md quotes for one run of `duration` seconds of arrivals (with
    `weights`, the fairness table compares service / weight)."""
    clients = result.clients
    served_by_end = metrics.accumulated_service(result, [duration], cost)
    received = {c: float(served_by_end[c][0]) / duration for c in clients}
    fair = metrics.fairness_summary(result, max(duration, TABLE_HORIZON_S), cost, weights)
    ticks = metrics.synthetic_ticks(duration, per=20)
    diff = metrics.service_difference(result, ticks, cost)
    curves = metrics.response_time(result, metrics.synthetic_ticks(duration))
    times = {c: metrics.mean_response_time(result, c) for c in clients}
    return {
        "duration_s": duration,
        "throughput_tok_s": round(metrics.throughput(result), 1),
        "service_rate_tok_s": {c: round(v, 1) for c, v in received.items()},
        "mean_response_s": {c: round(v, 2) for c, v in times.items()},
        "service_difference_max": round(float(diff.max()), 1),
        "service_difference_at_end": round(float(diff[-1]), 1),
        "service_difference_by_time": {f"{t:g}": round(float(d), 1) for t, d in zip(ticks, diff)},
        "response_time_range_s": {
            c: [round(float(np.nanmin(v)), 1), round(float(np.nanmax(v)), 1)] for c, v in curves.items()
        },
        "fairness": {"max": round(fair.max, 1), "avg": round(fair.avg, 1), "var": round(fair.var, 1)},
        "finished": result.count("finished"),
        "rejected": result.count("rejected"),
    }
