"""Figures beyond the base suites: the ablation (Fig 15), weighted VTC (Fig 16), length
prediction (Fig 19), and the two lift rules side by side (not in the paper)."""

from pathlib import Path

from slora_vtc.experiment import Experiment
from slora_vtc.figures.base import Figure, Results, run_numbers
from slora_vtc.figures.plot import panels, save, service_difference_panel, service_rate_panel
from slora_vtc.sched import scheduler_weights
from slora_vtc.suites import SUITES

LENGTHS = (256, 512, 768)


def _ablation() -> Figure:
    runs = {
        (pool, n): Experiment.of(suite=f"ablation_{pool}k_{n}", scheduler="vtc") for pool in (35, 65) for n in LENGTHS
    }
    fcfs = Experiment.of(suite="ablation_65k_256", scheduler="fcfs")

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(2)
        for ax, pool in zip(axes, (35, 65)):
            curves = {f"VTC {n}/{n}": (results[runs[pool, n]], 600.0) for n in LENGTHS}
            if pool == 65:
                curves["FCFS 256/256"] = (results[fcfs], 600.0)
            service_difference_panel(ax, curves, f"{pool}k-token pool")
        fig.suptitle("ablation: request length and pool size (paper Fig 15)")
        save(fig, out / "ablation.png")
        numbers = {f"{pool}k_{n}": run_numbers(results[e], 600.0) for (pool, n), e in runs.items()}
        numbers["65k_256 fcfs"] = run_numbers(results[fcfs], 600.0)
        return numbers

    return Figure("ablation", "15", "service difference vs request length and pool size", (*runs.values(), fcfs), draw)


def _weighted() -> Figure:
    suite = SUITES["overload_weighted"]
    plain, weighted = (
        Experiment.of(suite=suite.name, scheduler="vtc"),
        Experiment.of(suite=suite.name, scheduler="wvtc:1,2,3,4"),
    )

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(2)
        service_rate_panel(axes[0], results[plain], suite.duration, "VTC")
        service_rate_panel(axes[1], results[weighted], suite.duration, "weighted VTC, weights 1:2:3:4")
        fig.suptitle(f"{suite.description} (paper Fig 16)")
        save(fig, out / "weighted.png")
        weights = scheduler_weights(weighted.scheduling.scheduler, list(SUITES[suite.name].workload().clients))
        numbers = {
            "vtc": run_numbers(results[plain], suite.duration),
            "wvtc": run_numbers(results[weighted], suite.duration, weights=weights),
        }
        for key in numbers:
            rates = numbers[key]["service_rate_tok_s"]
            base = rates["client0"]
            numbers[key]["ratio_to_client0"] = {c: round(v / base, 2) for c, v in rates.items()}
        return numbers

    return Figure("weighted", "16", "weighted VTC: service follows weights 1:2:3:4", (plain, weighted), draw)


PREDICTION_SCHEDULERS = {"VTC": "vtc", "VTC +-50% prediction": "vtc-pred:0.5", "VTC oracle": "vtc-oracle"}


def _prediction() -> Figure:
    cases = {"overload": 360.0, "overload_multi": 360.0}
    runs = {
        (suite, label): Experiment.of(suite=suite, scheduler=spec, duration=d)
        for suite, d in cases.items()
        for label, spec in PREDICTION_SCHEDULERS.items()
    }

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(2)
        for ax, (suite, duration) in zip(axes, cases.items()):
            curves = {label: (results[runs[suite, label]], duration) for label in PREDICTION_SCHEDULERS}
            clients = SUITES[suite].num_clients
            service_difference_panel(ax, curves, f"{clients} backlogged clients ({suite}, {duration:.0f} s)")
        fig.suptitle("VTC with output-length prediction (paper Fig 19)")
        save(fig, out / "length_prediction.png")
        return {f"{suite} {label}": run_numbers(results[e], cases[suite]) for (suite, label), e in runs.items()}

    return Figure(
        "length_prediction", "19", "length prediction on 2 and 8 backlogged clients", tuple(runs.values()), draw
    )


def _lift() -> Figure:
    """The rules differ only when a client arrives while nobody waits: rare under overload."""
    suites = ("overload_multi", "ablation_65k_512")
    runs = {
        (s, lift): Experiment.of(suite=s, scheduler="vtc", lift=lift) for s in suites for lift in ("paper", "artifact")
    }

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(len(suites))
        for ax, suite in zip(axes, suites):
            curves = {
                f"{lift} lift": (results[runs[suite, lift]], SUITES[suite].duration) for lift in ("paper", "artifact")
            }
            service_difference_panel(ax, curves, suite)
        fig.suptitle("VTC's lift rules: the paper's (also lift when no client waits) vs the artifact's")
        save(fig, out / "lift_rules.png")
        return {f"{s} {lift}": run_numbers(results[e], SUITES[s].duration) for (s, lift), e in runs.items()}

    return Figure("lift_rules", "-", "paper vs artifact lift rule where they differ", tuple(runs.values()), draw)


FIGURES = [_ablation(), _weighted(), _prediction(), _lift()]
