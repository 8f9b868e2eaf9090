"""What `run`, `compare`, `replay` and `bench-http` print: a label saying what ran, one row per
run (80 columns at most) and a legend naming every column's meaning and unit."""

import textwrap

from slora_vtc import summary
from slora_vtc.errors import UserError
from slora_vtc.experiment import cost_function
from slora_vtc.results import RunResult
from slora_vtc.sched import scheduler_weights

WIDTH = 79
LEGEND = (
    "diff: the paper's fairness table, the max / avg / variance over 60 s windows of the "
    "clients' unmet service share (service/s; lower is fairer). tok/s: prompt + output tokens "
    "served per second. TTFT s: mean time to first token of the finished requests."
)
WEIGHTED = "The diff of a weighted scheduler compares service / weight."


def run_label(config: dict) -> str:
    """What a result file's run was: workload, duration and the settings that shape it."""
    workload = config.get("suite") or config.get("workload") or "run"
    if config.get("trace"):
        workload = f"{workload} ({config['trace']})"
    duration = config.get("duration")
    parts = [
        workload,
        f"arrivals over {duration:g} s" if isinstance(duration, int | float) else None,
        f"pool {config['pool_tokens']} tokens" if "pool_tokens" in config else None,
        f"{config.get('cost', 'linear')} cost",
        f"backend {config.get('backend', 'sim')}",
        f"seed {config['seed']}" if config.get("seed", 42) != 42 else None,
    ]
    return ", ".join(p for p in parts if p)


def summary_row(result: RunResult) -> dict:
    config = result.config
    fair = summary.fairness(
        result, float(config.get("duration", 600)), cost_function(config.get("cost", "linear")), _weights(result)
    )
    return {
        "scheduler": config.get("scheduler", "?"),
        "diff max": fair.max,
        "diff avg": fair.avg,
        "diff var": fair.var,
        "tok/s": summary.throughput(result),
        "TTFT s": summary.mean_response_time(result),
        "done": result.count("finished"),
        "rej": result.count("rejected"),
        "abort": result.count("aborted"),
    }


def summary_table(results: list[RunResult]) -> str:
    if not any(r.count("finished") for r in results):
        raise UserError("no request finished, so there is nothing to summarise")
    rows = [summary_row(r) for r in results]
    labels = [
        line for label in dict.fromkeys(run_label(r.config) for r in results) for line in textwrap.wrap(label, WIDTH)
    ]
    legend = LEGEND + (" " + WEIGHTED if any(_weights(r) for r in results) else "")
    return "\n".join([*labels, plain_table(rows), *textwrap.wrap(legend, WIDTH)])


def plain_table(rows: list[dict]) -> str:
    """Columns right-aligned two spaces apart, numbers to one decimal: the table pandas printed
    here, without importing pandas (a fifth of a second of every run's start)."""
    headers = list(rows[0])
    lines = [headers, *([_cell(row[h]) for h in headers] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return "NaN" if value != value else f"{value:.1f}"
    return str(value)


def _weights(result: RunResult) -> dict[str, float] | None:
    """The client weights of a weighted scheduler's run (None for an unweighted one)."""
    scheduler = result.config.get("scheduler")
    return scheduler_weights(scheduler, result.clients) if scheduler else None
