"""Figures 3-10: each synthetic suite's service rate and response time per scheduler, and the
absolute service difference where the paper compares schedulers. Measured curves are drawn
dashed beside ours for the suite the artifact measured (overload)."""

from dataclasses import dataclass
from pathlib import Path

from slora_vtc.data import MEASURED
from slora_vtc.data import measured_run as measured_file
from slora_vtc.experiment import Experiment
from slora_vtc.figures.base import Figure, Results, run_numbers
from slora_vtc.figures.plot import (
    MEASURED_STYLE,
    panels,
    response_time_panel,
    save,
    service_difference_panel,
    service_rate_panel,
)
from slora_vtc.results import RunResult, read_results
from slora_vtc.suites import SUITES


def measured_run(filename: str) -> RunResult:
    return read_results(measured_file(filename))[0]


@dataclass(frozen=True)
class Measured:
    """A run the artifact measured: its result file, and the testbed (session) it ran on."""

    file: str
    testbed: str


def suite_figure(
    suite_name: str,
    measured: dict[str, Measured] | None = None,
    durations: dict[str, float] | None = None,
    extra: dict[str, Experiment] | None = None,
) -> Figure:
    """`durations` overrides the suite's per scheduler, to match a measured run's own duration; a
    measured run is drawn dashed beside ours, simulated on its own testbed. `extra` runs are only
    reported in numbers.json."""
    suite = SUITES[suite_name]
    schedulers = suite.schedulers
    measured, extra = measured or {}, extra or {}
    duration = {s: (durations or {}).get(s, suite.duration) for s in schedulers}
    experiments = {
        s: Experiment.of(
            suite=suite_name,
            scheduler=s,
            duration=(durations or {}).get(s),
            **({"testbed": measured[s].testbed} if s in measured else {}),
        )
        for s in schedulers
    }

    def draw(results: Results, out: Path) -> dict:
        runs = {s: results[e] for s, e in experiments.items()}
        truth = {s: measured_run(m.file) for s, m in measured.items()}
        compare = len(schedulers) > 1
        fig, axes = panels(6, rows=2) if compare else panels(2)
        for k, s in enumerate(schedulers):
            row = axes[3 * k :] if compare else axes
            service_rate_panel(row[0], runs[s], duration[s], f"{s.upper()}: service rate", measured=truth.get(s))
            response_time_panel(row[1], runs[s], duration[s], f"{s.upper()}: response time", measured=truth.get(s))
        if compare:
            axes[5].set_visible(False)
            curves = {f"{s.upper()} (sim)": (runs[s], duration[s]) for s in schedulers}
            styles = {f"{s.upper()} (sim)": {"color": f"C{k}"} for k, s in enumerate(schedulers)}
            for k, s in enumerate(schedulers):
                if s in truth:
                    label = f"{s.upper()} (measured)"
                    curves[label] = (truth[s], duration[s])
                    styles[label] = {"color": f"C{k}", **MEASURED_STYLE}
            service_difference_panel(axes[2], curves, "absolute service difference", styles=styles)
        fig.suptitle(f"{suite.name}: {suite.description} (paper Fig {suite.figure})")
        save(fig, out / f"{suite_name}.png")
        numbers = {
            s: {**run_numbers(r, duration[s]), "testbed": experiments[s].backend.testbed} for s, r in runs.items()
        }
        for s, r in truth.items():
            numbers[f"{s} (measured)"] = run_numbers(r, duration[s])
        for label, exp in extra.items():
            numbers[label] = {
                **run_numbers(results[exp], exp.workload.build().duration),
                "testbed": exp.backend.testbed,
            }
        return numbers

    inputs = tuple(f"{MEASURED}/{m.file}" for m in measured.values())
    return Figure(suite_name, suite.figure, suite.description, (*experiments.values(), *extra.values()), draw, inputs)


FIGURES = [
    # the artifact's measured VTC run lasted 360 s (June 2024), its FCFS run 600 s (December 2023)
    suite_figure(
        "overload",
        measured={
            "vtc": Measured("vtc_overload.jsonl", "a10g-2024"),
            "fcfs": Measured("fcfs_overload.jsonl", "a10g-2023"),
        },
        durations={"vtc": 360.0},
        extra={
            "vtc 600 s": Experiment.of(suite="overload", scheduler="vtc"),  # what `slora-vtc run --suite overload` runs
            "fcfs on a10g-2024": Experiment.of(suite="overload", scheduler="fcfs"),
        },
    ),  # the sessions' difference
    suite_figure("proportional"),
    suite_figure("on_off_less"),
    suite_figure("on_off_overload"),
    suite_figure("poisson_short_long"),
    suite_figure("poisson_short_long_2"),
    suite_figure("increase"),
    suite_figure("dist_shift"),
]
