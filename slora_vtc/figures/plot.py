"""Drawing helpers shared by the figures: one panel type per metric of metrics.py."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from slora_vtc import metrics  # noqa: E402
from slora_vtc.cost import CostFunction, LinearCost  # noqa: E402
from slora_vtc.results import RunResult  # noqa: E402

MEASURED_STYLE = {"linestyle": "--", "alpha": 0.8}


def client_label(index: int) -> str:
    return f"client {index}"


def service_rate_panel(
    ax,
    result: RunResult,
    duration: float,
    title: str,
    cost: CostFunction = LinearCost(),
    measured: RunResult | None = None,
):
    ticks = metrics.synthetic_ticks(duration)
    ours = metrics.service_rate(result, ticks, cost)
    for i, client in enumerate(result.clients):
        ax.plot(ticks, ours[client], label=client_label(i), color=f"C{i}")
    if measured is not None:
        _measured_rates(ax, measured, cost)
    ax.set(title=title, xlabel="time (s)", ylabel="service rate (tokens/s)")
    ax.legend(fontsize="small")


def _measured_rates(ax, measured: RunResult, cost: CostFunction):
    _measured_curves(ax, measured, lambda ticks: metrics.service_rate(measured, ticks, cost))


def _measured_curves(ax, measured: RunResult, curves):
    """The artifact's measured run, dashed, at its own duration's ticks."""
    ticks = metrics.synthetic_ticks(float(measured.config.get("duration", 600)))
    values = curves(ticks)
    for i, client in enumerate(measured.clients):
        ax.plot(ticks, values[client], color=f"C{i}", label=f"{client_label(i)} (measured)", **MEASURED_STYLE)


def response_time_panel(
    ax, result: RunResult, duration: float, title: str, ticks=None, measured: RunResult | None = None
):
    ticks = metrics.synthetic_ticks(duration) if ticks is None else ticks
    times = metrics.response_time(result, ticks)
    for i, client in enumerate(result.clients):
        ax.plot(ticks, times[client], label=client_label(i), color=f"C{i}")
    if measured is not None:
        _measured_curves(ax, measured, lambda t: metrics.response_time(measured, t))
    ax.set(title=title, xlabel="time (s)", ylabel="response time (s)")
    ax.legend(fontsize="small")


def service_difference_panel(
    ax,
    curves: dict[str, tuple[RunResult, float]],
    title: str,
    cost: CostFunction = LinearCost(),
    styles: dict | None = None,
):
    """One line per label: the absolute difference of accumulated service over time."""
    for k, (label, (result, duration)) in enumerate(curves.items()):
        ticks = metrics.synthetic_ticks(duration, per=20)
        style = (styles or {}).get(label, {"color": f"C{k}"})
        ax.plot(ticks, metrics.service_difference(result, ticks, cost), marker=".", label=label, **style)
    ax.set(title=title, xlabel="time (s)", ylabel="abs. service difference (tokens)")
    ax.legend(fontsize="small")


def save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def panels(n: int, width: float = 4.6, height: float = 3.4, rows: int = 1):
    cols = int(np.ceil(n / rows))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    return fig, list(axes.flat)
