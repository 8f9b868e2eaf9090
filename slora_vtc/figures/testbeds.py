"""Not in the paper: the same workloads on the artifact's two measurement sessions (testbeds).

Their decode steps differ by 2.6 % (docs/design.md, "The simulator and its calibration"). Near
saturation queueing amplifies that into large changes of the mean time to first token, which is
why a simulator must be calibrated to the session of the runs it is compared with."""

from pathlib import Path

import numpy as np

from slora_vtc import metrics
from slora_vtc.backends.sim import TESTBEDS
from slora_vtc.experiment import Experiment
from slora_vtc.figures.base import Figure, Results
from slora_vtc.figures.plot import panels, save
from slora_vtc.suites import SUITES

WORKLOADS = (
    "overload",
    "proportional",
    "on_off_less",
    "on_off_overload",
    "poisson_short_long",
    "poisson_short_long_2",
    "increase",
    "dist_shift",
    "overload_weighted",
)
NEW, OLD = "a10g-2024", "a10g-2023"


def _sensitivity() -> Figure:
    cases = [(suite, s) for suite in WORKLOADS for s in SUITES[suite].schedulers if not s.startswith("wvtc")]
    runs = {
        (suite, s, tb): Experiment.of(suite=suite, scheduler=s, testbed=tb) for suite, s in cases for tb in TESTBEDS
    }

    def draw(results: Results, out: Path) -> dict:
        numbers = {}
        fig, axes = panels(1, width=9.0)
        for k, (suite, s) in enumerate(cases):
            new, old = results[runs[suite, s, NEW]], results[runs[suite, s, OLD]]
            change = {
                c: metrics.mean_response_time(old, c) / metrics.mean_response_time(new, c) - 1 for c in new.clients
            }
            axes[0].plot([k] * len(change), [100 * v for v in change.values()], "o", color="C0")
            numbers[f"{suite} {s}"] = {
                "throughput_tok_s": {NEW: round(metrics.throughput(new), 1), OLD: round(metrics.throughput(old), 1)},
                "mean_ttft_s": {
                    c: {
                        NEW: round(metrics.mean_response_time(new, c), 2),
                        OLD: round(metrics.mean_response_time(old, c), 2),
                    }
                    for c in new.clients
                },
                "ttft_change_pct": {c: round(100 * v, 1) for c, v in change.items()},
            }
        changes = [abs(v) for n in numbers.values() for v in n["ttft_change_pct"].values()]
        axes[0].axhline(0, color="k", linewidth=0.5)
        axes[0].set(
            title=f"mean time to first token per client: {OLD} against {NEW}",
            ylabel="change (%)",
            xticks=np.arange(len(cases)),
            xticklabels=[f"{suite}\n{s}" for suite, s in cases],
        )
        axes[0].tick_params(axis="x", labelsize=6)
        save(fig, out / "testbed_sensitivity.png")
        numbers["largest_change_pct"] = round(max(changes), 1)
        numbers["clients_over_10_pct"] = sum(v > 10 for v in changes)
        numbers["clients"] = len(changes)
        return numbers

    return Figure(
        "testbed_sensitivity",
        "-",
        "each synthetic workload on the artifact's two measured sessions",
        tuple(runs.values()),
        draw,
    )


FIGURES = [_sensitivity()]
