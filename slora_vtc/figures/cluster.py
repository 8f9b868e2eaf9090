"""Figures for a cluster of replicas (docs/beyond.md): fairness across replicas per router as the
cluster grows, locality-aware routing on a prefix workload, and routers with their own counters.

A cluster of N replicas gets N times one engine's load (`load_scale`), so every replica is as
loaded as the single engine of the paper's figure.
"""

from pathlib import Path

from matplotlib.ticker import NullLocator

from slora_vtc import metrics
from slora_vtc.experiment import Experiment
from slora_vtc.figures.base import Figure, Results
from slora_vtc.figures.plot import panels, save

SIZES = (2, 4, 16, 64)
W_Q, POOL = 2, 10_000  # the paper's output-token weight, and every replica's pool (the suites' A10G default)
ROUTERS = {  # label -> (router, the replicas' scheduler)
    "round-robin + VTC": ("round-robin", "vtc"),
    "least-load + VTC": ("least-load", "vtc"),
    "prefix-affinity + VTC": ("prefix-affinity", "vtc"),
    "D2LPM (Q_w 20k, dlpm:8000)": ("d2lpm:20000", "dlpm:8000"),
    "global VTC": ("global-vtc", "vtc"),
}
WORKLOADS = {"overload": dict(duration=120.0), "real": dict(duration=300.0)}
PREFIX_SUITE, PREFIX_SIZES = "prefix_qa_s1", (2, 4, 8)
PREFIX_ROUTERS = {**ROUTERS, "round-robin + LPM": ("round-robin", "lpm")}
SYNC = (None, 120.0, 60.0, 20.0, 5.0, 1.0, 0.0)  # seconds between counter synchronisations (None: never)
SYNC_S = 300.0  # long enough that a few sync intervals pass after the start-up


def _cluster(suite: str, n: int, router: str, scheduler: str, **settings) -> Experiment:
    """Served while the clients send (what a backlog would take to drain is no measure of sharing)."""
    settings.setdefault("horizon", settings["duration"])
    return Experiment.of(suite=suite, scheduler=scheduler, replicas=n, router=router, load_scale=n, **settings)


def cluster_numbers(result, duration: float) -> dict:
    ticks = metrics.synthetic_ticks(duration, per=20)
    latency = {c: v for c, v in metrics.latency_by_client(result).items() if v == v}  # NaN: it finished nothing
    return {
        "throughput_tok_s": round(metrics.throughput(result), 1),
        "service_difference_max": round(float(metrics.service_difference(result, ticks).max()), 1),
        "jain": round(metrics.jain_index(result, duration / 4, duration), 3),
        "load_imbalance": round(metrics.load_imbalance(result), 3),
        "mean_latency_s": {c: round(v, 2) for c, v in latency.items()},
    }


def _routers() -> Figure:
    runs = {
        (w, n, label): _cluster(w, n, router, sched, **settings)
        for w, settings in WORKLOADS.items()
        for n in SIZES
        for label, (router, sched) in ROUTERS.items()
    }

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(2 * len(WORKLOADS), width=4.4, height=3.4, rows=2)
        numbers = {}
        for col, (w, settings) in enumerate(WORKLOADS.items()):
            numbers[w] = {
                f"{n}": {label: cluster_numbers(results[runs[w, n, label]], settings["duration"]) for label in ROUTERS}
                for n in SIZES
            }
            for n in SIZES:
                for row in numbers[w][
                    f"{n}"
                ].values():  # against global VTC's bound, 2 w_q sum(M) over the replicas' pools
                    row["difference_vs_bound"] = round(row["service_difference_max"] / (2 * W_Q * n * POOL), 4)
            for row, key in enumerate(("difference_vs_bound", "throughput_tok_s")):
                ax = axes[row * len(WORKLOADS) + col]
                for k, label in enumerate(ROUTERS):
                    ax.plot(
                        SIZES, [numbers[w][f"{n}"][label][key] for n in SIZES], marker="o", color=f"C{k}", label=label
                    )
                ax.set(
                    xscale="log",
                    xticks=SIZES,
                    xticklabels=[str(n) for n in SIZES],
                    xlabel="replicas",
                    ylabel=key.replace("_", " "),
                    title=f"{w} at N x one engine's load",
                )
                ax.xaxis.set_minor_locator(NullLocator())  # only the cluster sizes, no log-scale minor labels
                if key == "difference_vs_bound":
                    ax.set(yscale="log", ylabel="max service difference / (2 w_q sum M)")
                ax.legend(fontsize="x-small")
        fig.suptitle("fairness across replicas: max service difference (against the bound) and throughput per router")
        save(fig, out / "cluster_routers.png")
        return numbers

    return Figure(
        "cluster_routers", "-", "fairness across replicas per router, 2 to 64 replicas", tuple(runs.values()), draw
    )


def _prefix_routing() -> Figure:
    runs = {
        (n, label): _cluster(PREFIX_SUITE, n, router, sched, prefix_cache=True, duration=90.0)
        for n in PREFIX_SIZES
        for label, (router, sched) in PREFIX_ROUTERS.items()
    }

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(3, width=4.6, height=3.4)
        numbers = {}
        for n in PREFIX_SIZES:
            numbers[f"{n}"] = {}
            for label in PREFIX_ROUTERS:
                r = results[runs[n, label]]
                row = cluster_numbers(r, 90.0)
                row["cache_hit_rate"] = round(metrics.cache_hit_rate(r), 3)
                numbers[f"{n}"][label] = row
        labels = list(PREFIX_ROUTERS)
        width = 0.8 / len(PREFIX_SIZES)
        for ax, key in zip(axes, ("throughput_tok_s", "jain", "cache_hit_rate")):
            for k, n in enumerate(PREFIX_SIZES):
                ax.bar(
                    [i + k * width for i in range(len(labels))],
                    [numbers[f"{n}"][label][key] for label in labels],
                    width,
                    label=f"{n} replicas",
                )
            ax.set_xticks(
                [i + width * (len(PREFIX_SIZES) - 1) / 2 for i in range(len(labels))],
                labels,
                rotation=60,
                ha="right",
                fontsize="x-small",
            )
            ax.set(title=key.replace("_", " "))
            ax.legend(fontsize="x-small")
        fig.suptitle(f"{PREFIX_SUITE} on a cluster, prefix cache on (client 0 floods)")
        save(fig, out / "cluster_prefix.png")
        for n in PREFIX_SIZES:
            rows = numbers[f"{n}"]
            well = "client1"  # the well-behaved client of an S1 suite
            d2lpm = rows["D2LPM (Q_w 20k, dlpm:8000)"]["mean_latency_s"].get(well)
            numbers[f"{n}"]["well_behaved_latency_vs_d2lpm"] = {
                label: _ratio(rows[label]["mean_latency_s"].get(well), d2lpm) for label in labels
            }
        return numbers

    return Figure("cluster_prefix", "-", "locality-aware routing on a prefix workload", tuple(runs.values()), draw)


def _ratio(value, base) -> float | None:
    """value / base; None where either is missing (a client that finished nothing has no latency)."""
    if value is None or base is None or value != value or base != base or base == 0:
        return None
    return round(value / base, 2)


def _sync() -> Figure:
    runs = {
        s: _cluster(
            "overload", 2, "global-vtc", "wvtc:4,1", duration=SYNC_S, routers=2, router_sync=s, ingress_skew=1.0
        )
        for s in SYNC
    }
    single = _cluster("overload", 2, "global-vtc", "wvtc:4,1", duration=SYNC_S)

    def draw(results: Results, out: Path) -> dict:
        def ratio(result) -> float:
            got = metrics.window_service_rates(result, SYNC_S / 4, SYNC_S)
            return got["client0"] / got["client1"]

        numbers = {
            "one router": round(ratio(results[single]), 2),
            **{("never" if s is None else f"{s:g}"): round(ratio(results[runs[s]]), 2) for s in SYNC},
        }
        fig, axes = panels(1, width=5.2, height=3.6)
        xs = [s if s is not None else 1000.0 for s in SYNC]
        axes[0].plot(
            [max(x, 0.05) for x in xs],
            [numbers["never" if s is None else f"{s:g}"] for s in SYNC],
            marker="o",
            label="2 routers, own counters",
        )
        axes[0].axhline(numbers["one router"], color="C1", linestyle="--", label="one router")
        axes[0].axhline(4.0, color="grey", linestyle=":", label="the policy, 4 : 1")
        axes[0].set(
            xscale="log",
            xlabel="seconds between synchronisations (right: never; left: every step)",
            ylabel="service client 0 : client 1",
            title="weighted VTC 4:1 behind 2 routers, each client entering by its own",
        )
        axes[0].legend(fontsize="x-small")
        save(fig, out / "cluster_sync.png")
        return numbers

    return Figure(
        "cluster_sync",
        "-",
        "routers with their own counters: the 4:1 policy and the sync interval",
        (single, *runs.values()),
        draw,
    )


FIGURES = [_routers(), _prefix_routing(), _sync()]
