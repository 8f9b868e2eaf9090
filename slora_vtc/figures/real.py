"""Real-trace figures (Figs 11-14, 18, 20), on the paper's LMSYS trace.

Response times are averaged over a 60 s window every 6 s. The four clients drawn are the two
busiest and the two least busy of those that send throughout the trace (their requests span at
least 80% of it), so that both kinds are seen through the overloaded second half.
"""

from collections import Counter
from pathlib import Path

import numpy as np

from slora_vtc import metrics
from slora_vtc.experiment import Experiment, cost_function
from slora_vtc.figures.base import Figure, Results, run_numbers
from slora_vtc.figures.plot import panels, save
from slora_vtc.results import RunResult

DURATION = 600.0
TICKS = np.arange(0, DURATION + 1, 6.0)
RPM_LIMITS = (5, 10, 15, 20, 30)
LIGHT = 60  # clients with fewer requests than this in the trace are "light"


def short(client: str) -> str:
    stem = client.rstrip("0123456789")
    return f"client {client[len(stem) :]}" if stem != client else client


def shown_clients(result: RunResult) -> list[str]:
    clients, sent = result.array("client"), result.array("req_time")
    ranked = [c for c, _ in Counter(clients).most_common()]
    steady = [c for c in ranked if np.ptp(sent[clients == c]) >= 0.8 * DURATION]
    return ranked[:2] + steady[-2:]


def response_panel(ax, result: RunResult, title: str, clients: list[str] | None = None):
    times = metrics.response_time(result, TICKS)
    clients = clients or result.clients
    many = len(clients) > 6
    for i, client in enumerate(clients):
        ax.plot(
            TICKS,
            times[client],
            label=None if many else short(client),
            color=f"C{i % 10}",
            linewidth=0.8 if many else 1.5,
        )
    ax.set(title=title, xlabel="time (s)", ylabel="response time (s)")
    if not many:
        ax.legend(fontsize="small")


def _experiments(*schedulers: str, cost: str = "linear") -> dict[str, Experiment]:
    return {s: Experiment.of(suite="real", scheduler=s, cost=cost) for s in schedulers}


def trace_stats(result: RunResult) -> dict:
    """What the paper states about its trace: average and range of the prompt and output lengths."""
    prompt, output = result.array("prompt_len"), result.array("output_len")
    return {
        "requests": len(prompt),
        "clients": len(result.clients),
        "avg_input": round(float(prompt.mean()), 1),
        "avg_output": round(float(output.mean()), 1),
        "input_range": [int(prompt.min()), int(prompt.max())],
        "output_range": [int(output.min()), int(output.max())],
    }


def _response_figure(
    name: str, figure: str, title: str, runs: dict[str, Experiment], all_clients: bool = False
) -> Figure:
    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(len(runs), rows=1 if len(runs) < 4 else 2)
        clients = None if all_clients else shown_clients(results[next(iter(runs.values()))])
        for ax, (label, exp) in zip(axes, runs.items()):
            response_panel(ax, results[exp], label.upper(), clients)
        fig.suptitle(f"{title} (paper Fig {figure})")
        save(fig, out / f"{name}.png")
        first = results[next(iter(runs.values()))]
        return {"trace": trace_stats(first)} | {
            label: _trace_numbers(results[exp], cost_function(exp.scheduling.cost)) for label, exp in runs.items()
        }

    return Figure(name, figure, title, tuple(runs.values()), draw)


def _trace_numbers(result: RunResult, cost) -> dict:
    numbers = run_numbers(result, DURATION, cost)
    slowest = max(numbers["mean_response_s"].items(), key=lambda kv: kv[1])
    return {
        **numbers,
        "worst_client_mean_response_s": round(slowest[1], 1),
        "mean_response_all_s": round(metrics.mean_response_time(result), 2),
        **_second_half(result),
    }


def _second_half(result: RunResult) -> dict:
    """Waits of requests sent in the overloaded second half: light clients (< LIGHT requests) and the rest."""
    clients, sent = result.array("client"), result.array("req_time")
    late = (sent > DURATION / 2) & (result.array("status") == "finished")
    counts = Counter(clients)
    light = np.array([counts[c] < LIGHT for c in clients])
    ttft = result.array("first_token_latency")
    per_light = [
        ttft[late & (clients == c)].mean()
        for c in result.clients
        if counts[c] < LIGHT and (late & (clients == c)).any()
    ]
    return {
        "second_half": {
            "light_clients": len(per_light),
            "light_mean_s": round(float(ttft[late & light].mean()), 1),
            "light_worst_client_s": round(float(max(per_light)), 1),
            "busy_mean_s": {
                c: round(float(ttft[late & (clients == c)].mean()), 1) for c in result.clients if counts[c] >= LIGHT
            },
        }
    }


def _rpm_throughput() -> Figure:
    runs = _experiments("vtc", "fcfs", *(f"rpm:{r}" for r in RPM_LIMITS))

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(1, width=5.5)
        rpm = [metrics.throughput(results[runs[f"rpm:{r}"]]) for r in RPM_LIMITS]
        axes[0].plot(RPM_LIMITS, rpm, "o-", label="RPM")
        axes[0].axhline(metrics.throughput(results[runs["vtc"]]), color="C1", label="VTC")
        axes[0].set(
            title="throughput vs request-rate limit (paper Fig 14)",
            xlabel="RPM limit",
            ylabel="throughput (tokens/s)",
            ylim=(0, None),
        )
        axes[0].legend()
        save(fig, out / "real_rpm_throughput.png")
        return {label: round(metrics.throughput(results[e]), 1) for label, e in runs.items()} | {
            f"rejected {label}": results[e].count("rejected") for label, e in runs.items() if label.startswith("rpm")
        }

    return Figure(
        "real_rpm_throughput", "14", "real trace: throughput against the RPM limit", tuple(runs.values()), draw
    )


FIGURES = [
    _response_figure("real_vtc_fcfs", "11", "real trace: response time, VTC vs FCFS", _experiments("vtc", "fcfs")),
    _response_figure(
        "real_rpm",
        "12",
        "real trace: response time under RPM limits",
        _experiments(*(f"rpm:{r}" for r in RPM_LIMITS[:4])),
    ),
    _response_figure(
        "real_rpm5_all",
        "13",
        "real trace: all 27 clients at RPM 5 and under VTC",
        _experiments("rpm:5", "vtc"),
        all_clients=True,
    ),
    _rpm_throughput(),
    _response_figure(
        "real_profiled_cost",
        "18",
        "real trace, profiled cost h: all 27 clients",
        {
            "fcfs": Experiment.of(suite="real", scheduler="fcfs"),
            "rpm:20": Experiment.of(suite="real", scheduler="rpm:20"),
            "lcf": Experiment.of(suite="real", scheduler="lcf", cost="profile"),
            "vtc": Experiment.of(suite="real", scheduler="vtc", cost="profile"),
        },
        all_clients=True,
    ),
    _response_figure(
        "real_length_prediction",
        "20",
        "real trace: VTC with length prediction",
        _experiments("vtc", "vtc-oracle", "vtc-avg", "vtc-pred:0.5"),
    ),
]
