"""Figures beyond the paper (docs/beyond.md): fair scheduling with a prefix cache (FCFS, LPM, VTC,
VTC on extend tokens, DLPM at several quanta, on the prefix suites), the DLPM paper's frontier of
fairness against throughput as the quantum grows, and conservative against optimistic admission.

Service is the paper's (1 per prompt token, cached or not, 2 per output token). The prefix runs
stop when the clients stop sending (requests left are aborted); throughput is what finished
divided by that time. Jain's index is taken over the clients' service rates from a quarter into
the arrivals to their end, while every client is backlogged (tests/sim/test_prefix_suites.py
checks that they are).
"""

from pathlib import Path

from slora_vtc import metrics
from slora_vtc.experiment import Experiment
from slora_vtc.figures.base import Figure, Results
from slora_vtc.figures.plot import panels, save, service_difference_panel, service_rate_panel
from slora_vtc.suites import SUITES

WORKLOADS = ("qa", "tot", "judge", "chat")
VARIANTS = ("", "_s1", "_s2")
QUANTA = (2000, 8000, 32000)  # dlpm.md section 6 recommends ~8k
FRONTIER_QUANTA = (500, 1000, 2000, 4000, 8000, 16000, 32000, 64000)
LOCALITY = {
    "FCFS": dict(scheduler="fcfs"),
    "LPM": dict(scheduler="lpm"),
    "VTC": dict(scheduler="vtc"),
    "VTC extend": dict(scheduler="vtc", charge_cached=0.0),
    **{f"DLPM {q // 1000}k": dict(scheduler=f"dlpm:{q}") for q in QUANTA},
}
PREEMPTION_SUITES = ("overload", "proportional", "real")
ADMISSION = {
    "VTC conservative": dict(scheduler="vtc"),
    "VTC optimistic": dict(scheduler="vtc", admission="optimistic"),
    "VTC optimistic, recompute charged": dict(scheduler="vtc", admission="optimistic", charge_recompute=True),
    "FCFS conservative": dict(scheduler="fcfs"),
    "FCFS optimistic": dict(scheduler="fcfs", admission="optimistic"),
}


def _prefix_run(suite: str, settings: dict) -> Experiment:
    """Served while the clients send (the suite's duration): what a backlog left at the end would
    take to drain says nothing of how the clients shared the server, and costs 10x the run."""
    return Experiment.of(suite=suite, prefix_cache=True, horizon=SUITES[suite].duration, **settings)


def jain(result, duration: float) -> float:
    return metrics.jain_index(result, duration / 4, duration)


def locality_numbers(result, duration: float) -> dict:
    rates = metrics.window_service_rates(result, duration / 4, duration)
    return {
        "throughput_tok_s": round(metrics.throughput(result), 1),
        "cache_hit_rate": round(metrics.cache_hit_rate(result), 3),
        "jain": round(jain(result, duration), 3),
        "service_rate_tok_s": {c: round(v, 1) for c, v in rates.items()},
        "mean_response_s": {c: round(metrics.mean_response_time(result, c), 2) for c in result.clients},
    }


def _locality() -> Figure:
    suites = [f"prefix_{w}{v}" for w in WORKLOADS for v in VARIANTS]
    runs = {(s, label): _prefix_run(s, settings) for s in suites for label, settings in LOCALITY.items()}

    def draw(results: Results, out: Path) -> dict:
        numbers = {
            s: {label: locality_numbers(results[runs[s, label]], SUITES[s].duration) for label in LOCALITY}
            for s in suites
        }
        _bars(numbers, suites, "throughput_tok_s", "throughput (tokens/s)", out / "prefix_throughput.png")
        _bars(numbers, suites, "cache_hit_rate", "prefix cache hit rate", out / "prefix_hit_rate.png")
        _bars(numbers, suites, "jain", "Jain's index of service rates", out / "prefix_locality.png")
        _service_over_time(results, runs, out)
        for s in suites:
            vtc = numbers[s]["VTC"]["throughput_tok_s"]
            for label in LOCALITY:
                numbers[s][label]["throughput_vs_vtc"] = round(numbers[s][label]["throughput_tok_s"] / vtc, 2)
        _write(out / "tables" / "prefix_locality.md", _locality_table(numbers, suites))
        _write(out / "tables" / "prefix_suites.md", _suite_table(suites))
        numbers["best_dlpm_vs_vtc"] = _best_dlpm(numbers, suites)
        numbers["best_dlpm_vs_vtc_outside_qa"] = _best_dlpm(
            numbers, [s for s in suites if not s.startswith("prefix_qa")]
        )
        return numbers

    return Figure(
        "prefix_locality",
        "-",
        "prefix suites: throughput, cache hit rate and Jain's index per scheduler",
        tuple(runs.values()),
        draw,
    )


def _best_dlpm(numbers: dict, suites: list[str]) -> dict:
    best = max(
        ((s, label) for s in suites for label in LOCALITY if label.startswith("DLPM")),
        key=lambda k: numbers[k[0]][k[1]]["throughput_vs_vtc"],
    )
    return {"suite": best[0], "scheduler": best[1], "ratio": numbers[best[0]][best[1]]["throughput_vs_vtc"]}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _locality_table(numbers: dict, suites: list[str]) -> str:
    """Per suite and scheduler: throughput (x VTC), cache hit rate, Jain's index."""
    labels = list(LOCALITY)
    lines = ["| suite | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for s in suites:
        cells = [
            f"{numbers[s][k]['throughput_tok_s']:,.0f} "
            f"({numbers[s][k]['throughput_tok_s'] / numbers[s]['VTC']['throughput_tok_s']:.2f}x), "
            f"{numbers[s][k]['cache_hit_rate']:.0%}, {numbers[s][k]['jain']:.2f}"
            for k in labels
        ]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _suite_table(suites: list[str]) -> str:
    """What each prefix suite offers, per client (seed 42, the whole duration)."""
    lines = [
        "| suite | duration (s) | client | requests | mean prompt | mean output | offered tokens/s (in + out) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in suites:
        workload = SUITES[s].workload()
        for client in workload.clients:
            mine = [r for r in workload.specs if r.client == client]
            prompt, output = sum(r.prompt_len for r in mine), sum(r.output_len for r in mine)
            lines.append(
                f"| {s} | {workload.duration:g} | {client} | {len(mine):,} | {prompt / len(mine):,.0f} | "
                f"{output / len(mine):,.0f} | {(prompt + output) / workload.duration:,.0f} |"
            )
    return "\n".join(lines) + "\n"


def _bars(numbers: dict, suites: list[str], key: str, ylabel: str, path: Path) -> None:
    fig, axes = panels(len(suites), width=4.2, height=3.0, rows=len(WORKLOADS))
    labels = list(LOCALITY)
    for ax, s in zip(axes, suites):
        values = [numbers[s][label][key] for label in labels]
        ax.bar(range(len(labels)), values, color=[f"C{i}" for i in range(len(labels))])
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize="x-small", ha="right")
        ax.set(title=s, ylabel=ylabel)
    fig.suptitle(f"{ylabel} on the prefix suites (prefix cache on)")
    save(fig, path)


def _service_over_time(results: Results, runs: dict, out: Path) -> None:
    """Per-client service rate over time, one PNG per workload: its three variants x every scheduler."""
    for workload in WORKLOADS:
        suites = [f"prefix_{workload}{v}" for v in VARIANTS]
        fig, axes = panels(len(LOCALITY) * len(suites), width=3.4, height=2.6, rows=len(suites))
        for row, s in enumerate(suites):
            for col, label in enumerate(LOCALITY):
                service_rate_panel(
                    axes[row * len(LOCALITY) + col], results[runs[s, label]], SUITES[s].duration, f"{s}: {label}"
                )
        fig.suptitle(f"service rate per client over time, prefix_{workload} (client 0 misbehaves in S1 / S2)")
        save(fig, out / f"prefix_service_{workload}.png")


def _frontier() -> Figure:
    suites = [f"prefix_{w}_s1" for w in WORKLOADS]
    points = {
        "VTC": dict(scheduler="vtc"),
        "VTC extend": dict(scheduler="vtc", charge_cached=0.0),
        "LPM": dict(scheduler="lpm"),
        "FCFS": dict(scheduler="fcfs"),
        **{f"DLPM {q}": dict(scheduler=f"dlpm:{q}") for q in FRONTIER_QUANTA},
    }
    runs = {(s, label): _prefix_run(s, settings) for s in suites for label, settings in points.items()}

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(len(suites), width=4.4, height=3.6)
        numbers = {}
        for ax, s in zip(axes, suites):
            d = SUITES[s].duration
            got = {
                label: (metrics.throughput(results[runs[s, label]]), jain(results[runs[s, label]], d))
                for label in points
            }
            dlpm = [got[f"DLPM {q}"] for q in FRONTIER_QUANTA]
            ax.plot([t for t, _ in dlpm], [j for _, j in dlpm], marker="o", color="C0", label="DLPM, Q = 500 .. 64k")
            for q, (t, j) in zip(FRONTIER_QUANTA, dlpm):
                ax.annotate(
                    f"{q // 1000}k" if q >= 1000 else str(q),
                    (t, j),
                    fontsize="x-small",
                    xytext=(3, 3),
                    textcoords="offset points",
                )
            for k, label in enumerate(("VTC", "VTC extend", "LPM", "FCFS")):
                ax.scatter(*got[label], marker="s", color=f"C{k + 1}", label=label, zorder=3)
            ax.set(title=s, xlabel="throughput (tokens/s)", ylabel="Jain's index")
            ax.legend(fontsize="x-small")
            numbers[s] = {
                label: {"throughput_tok_s": round(t, 1), "jain": round(j, 3)} for label, (t, j) in got.items()
            }
        fig.suptitle("fairness against throughput as DLPM's quantum grows (after the DLPM paper's Fig 1)")
        save(fig, out / "dlpm_frontier.png")
        return numbers

    return Figure(
        "dlpm_frontier", "-", "DLPM's fairness-throughput frontier over its quantum", tuple(runs.values()), draw
    )


def preemption_numbers(result, duration: float, pool: int) -> dict:
    responses = result.responses
    ticks = metrics.synthetic_ticks(duration, per=20)
    return {
        "throughput_tok_s": round(metrics.throughput(result), 1),
        "preemptions": sum(r.preemptions for r in responses),
        "recomputed_tokens": sum(r.recomputed for r in responses),
        "service_difference_max": round(float(metrics.service_difference(result, ticks).max()), 1),
        "bound_2_wq_M": 2 * 2 * pool,
    }


def _preemption_table(numbers: dict) -> str:
    lines = [
        "| suite | admission | throughput (tokens/s) | preemptions | recomputed tokens "
        "| max service difference | 2 w_q M |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, rows in numbers.items():
        for label, n in rows.items():
            lines.append(
                f"| {s} | {label} | {n['throughput_tok_s']:,.1f} | {n['preemptions']:,} | {n['recomputed_tokens']:,} | "
                f"{n['service_difference_max']:,.0f} | {n['bound_2_wq_M']:,} |"
            )
    return "\n".join(lines) + "\n"


def _preemption() -> Figure:
    runs = {
        (s, label): Experiment.of(suite=s, **settings)
        for s in PREEMPTION_SUITES
        for label, settings in ADMISSION.items()
    }

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(len(PREEMPTION_SUITES))
        numbers = {}
        for ax, s in zip(axes, PREEMPTION_SUITES):
            suite = SUITES[s]
            curves = {label: (results[runs[s, label]], suite.duration) for label in ADMISSION}
            styles = {
                label: {"color": f"C{k}", "linestyle": "--" if "optimistic" in label else "-"}
                for k, label in enumerate(ADMISSION)
            }
            service_difference_panel(ax, curves, f"{s}: {suite.description}", styles=styles)
            numbers[s] = {
                label: preemption_numbers(results[runs[s, label]], suite.duration, suite.pool_tokens)
                for label in ADMISSION
            }
        fig.suptitle("conservative (S-LoRA) against optimistic admission with preemption by recompute (vLLM)")
        save(fig, out / "preemption.png")
        _write(out / "tables" / "preemption.md", _preemption_table(numbers))
        return numbers

    return Figure(
        "preemption",
        "-",
        "conservative vs optimistic admission: service difference, preemptions, recompute",
        tuple(runs.values()),
        draw,
    )


FIGURES = [_locality(), _frontier(), _preemption()]
