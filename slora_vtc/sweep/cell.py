"""One cell of a sweep: its settings, a stable id, and `run_cell`, which runs it into one table row."""

import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np

from slora_vtc import metrics
from slora_vtc.experiment import Experiment, cost_function, default_settings
from slora_vtc.results import RunResult
from slora_vtc.runner import run_experiment
from slora_vtc.sched import scheduler_weights

OK, FAILED = "ok", "failed"


@dataclass(frozen=True)
class Cell:
    """The settings of one run (Experiment's flat keys) and which of them the grid varies."""

    settings: dict
    axes: tuple[str, ...] = ()

    def experiment(self) -> Experiment:
        return Experiment.of(**self.settings)

    @property
    def id(self) -> str:
        """A hash of the settings that differ from Experiment's defaults: the same run has the same id
        whether a default is spelt out or not, and after Experiment gains a setting."""
        defaults = default_settings()
        given = {k: v for k, v in self.experiment().flat().items() if k not in defaults or v != defaults[k]}
        return hashlib.sha256(json.dumps(given, sort_keys=True, default=list).encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={self.settings[k]}" for k in self.axes)


def run_cell(cell: Cell, plugins: tuple[str, ...] = ()) -> dict:
    """Run one cell (in a Ray task, a worker process or this one) into its row; a run that raises
    gives a failed row with the error's first line."""
    from slora_vtc.plugins import load_plugins  # a fresh worker process has none of the driver's plugins

    start = time.perf_counter()
    try:
        load_plugins(list(plugins))
        row = summary(run_experiment(cell.experiment()))
    except Exception as e:  # noqa: BLE001 - any error of one cell is that cell's result
        return failed_row(cell, error_line(e), time.perf_counter() - start)
    return {**settings_columns(cell), "status": OK, "error": "", **row, "wall_s": time.perf_counter() - start}


def failed_row(cell: Cell, error: str, wall_s: float = float("nan")) -> dict:
    return {**settings_columns(cell), "status": FAILED, "error": error, "wall_s": wall_s}


def error_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def settings_columns(cell: Cell) -> dict:
    """The cell id, one column per setting the file gives, and every setting as JSON."""
    columns = {k: json.dumps(v) if isinstance(v, tuple) else v for k, v in cell.settings.items()}
    return {"cell": cell.id, **columns, "settings": json.dumps(cell.experiment().flat(), default=list)}


def summary(result: RunResult) -> dict:
    """The run's summary metrics: throughput, the service difference over time, the paper's fairness
    table, per-client service rates over the arrivals, the request counts, the cache's hit rate and
    the load imbalance over replicas (1 for one engine)."""
    config = result.config
    duration = float(config["duration"])
    cost = cost_function(config.get("cost", "linear"), config.get("profile"))
    counts = {s: result.count(s) for s in ("finished", "rejected", "aborted")}
    fair = metrics.fairness_summary(result, duration, cost, scheduler_weights(config["scheduler"], result.clients))
    served = counts["finished"] > 0
    diff = metrics.service_difference(result, metrics.synthetic_ticks(duration), cost) if served else np.array([np.nan])
    rates = metrics.window_service_rates(result, 0.0, duration, cost) if served else {}
    return {
        "throughput": metrics.throughput(result),
        "service_diff_max": float(diff.max()),
        "service_diff_avg": float(diff.mean()),
        "fairness_max": fair.max,
        "fairness_avg": fair.avg,
        "fairness_var": fair.var,
        "ttft_mean": metrics.mean_response_time(result),
        "service_rates": json.dumps(rates),
        "requests": len(result.responses),
        **counts,
        "cache_hit_rate": metrics.cache_hit_rate(result),
        "preemptions": int(sum(r.preemptions for r in result.responses)),
        "total_time": result.total_time,
        "load_imbalance": metrics.load_imbalance(result) if metrics.replica_count(result) > 1 else 1.0,
    }
