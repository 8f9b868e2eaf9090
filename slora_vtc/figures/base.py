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


def run_numbers(result: RunResult, duration: float, cost: CostFunction = LinearCost()) -> dict:
    """The numbers paper_repro.md quotes for one run."""
    clients = result.clients
    served_by_end = metrics.accumulated_service(result, [duration], cost)
    received = {c: float(served_by_end[c][0]) / duration for c in clients}
    fair = metrics.fairness_summary(result, duration, cost)
    diff = metrics.service_difference(result, metrics.synthetic_ticks(duration, per=20), cost)
    times = {c: float(np.mean(result.array("first_token_latency")[(result.array("client") == c) & (result.array("status") == "finished")]))
             for c in clients}
    return {
        "throughput_tok_s": round(metrics.throughput(result), 1),
        "service_rate_tok_s": {c: round(v, 1) for c, v in received.items()},
        "mean_response_s": {c: round(v, 2) for c, v in times.items()},
        "service_difference_max": round(float(diff.max()), 1),
        "service_difference_at_end": round(float(diff[-1]), 1),
        "fairness": {"max": round(fair.max, 1), "avg": round(fair.avg, 1), "var": round(fair.var, 1)},
        "finished": result.count("finished"),
        "rejected": result.count("rejected"),
    }
