"""Not in the paper: how far a client's mean time to first token on the real trace moves when
every arrival comes up to 5 ms later, over an ensemble of seeds (the jitter of a real client's
timers and network). Under VTC the light clients' waits are chaotic; under FCFS they are not. A
single simulated run can therefore only be held to the ensemble's spread there."""

from pathlib import Path

import numpy as np

from slora_vtc import metrics
from slora_vtc.calibrate import MIN_REQUESTS  # light clients here: at least this many requests and fewer than LIGHT
from slora_vtc.experiment import Experiment
from slora_vtc.figures.base import Figure, Results
from slora_vtc.figures.plot import panels, save
from slora_vtc.figures.real import LIGHT, short
from slora_vtc.figures.tables import row

SEEDS = tuple(range(1, 13))
JITTER_MS = 5.0
SCHEDULERS = ("vtc", "fcfs")


def _light_clients(result) -> list[str]:
    counts = {c: int((result.array("client") == c).sum()) for c in result.clients}
    return [c for c, n in counts.items() if MIN_REQUESTS <= n < LIGHT]


def _table_band(runs) -> dict:
    """The fairness table's avg and max, and the throughput, over the ensemble: mean and range."""
    rows = [row(r, "linear") for r in runs]
    return {
        k: {
            "mean": round(float(np.mean([r[k] for r in rows])), 1),
            "min": min(r[k] for r in rows),
            "max": max(r[k] for r in rows),
        }
        for k in ("avg", "max", "throughput")
    }


def _spread() -> Figure:
    single = {s: Experiment.of(suite="real", scheduler=s) for s in SCHEDULERS}
    jittered = {
        (s, seed): Experiment.of(suite="real", scheduler=s, seed=seed, jitter_ms=JITTER_MS)
        for s in SCHEDULERS
        for seed in SEEDS
    }

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(len(SCHEDULERS), width=6.0)
        numbers = {"jitter_ms": JITTER_MS, "seeds": len(SEEDS)}
        for ax, s in zip(axes, SCHEDULERS):
            clients = _light_clients(results[single[s]])
            runs = np.array(
                [[metrics.mean_response_time(results[jittered[s, seed]], c) for c in clients] for seed in SEEDS]
            )
            base = [metrics.mean_response_time(results[single[s]], c) for c in clients]
            lo, hi = np.percentile(runs, 5, axis=0), np.percentile(runs, 95, axis=0)
            x = np.arange(len(clients))
            ax.vlines(x, lo, hi, color="C0", label=f"ensemble p5-p95 ({len(SEEDS)} seeds, 0-{JITTER_MS:g} ms jitter)")
            ax.plot(x, runs.mean(axis=0), "_", color="C0", markersize=12, label="ensemble mean")
            ax.plot(x, base, "o", color="C1", label="one run, no jitter")
            ax.set(
                title=f"{s.upper()}: light clients' mean time to first token",
                xlabel="client",
                ylabel="seconds",
                xticks=x,
                xticklabels=[short(c).removeprefix("client ") for c in clients],
            )
            ax.legend(fontsize="small")
            sd = runs.std(axis=0)
            numbers[s] = {
                "clients": {
                    c: {
                        "single_s": round(b, 2),
                        "mean_s": round(float(m), 2),
                        "sd_s": round(float(d), 2),
                        "p5_s": round(float(a), 2),
                        "p95_s": round(float(z), 2),
                    }
                    for c, b, m, d, a, z in zip(clients, base, runs.mean(axis=0), sd, lo, hi)
                },
                "median_sd_s": round(float(np.median(sd)), 2),
                "max_sd_s": round(float(sd.max()), 2),
                "median_relative_sd": round(float(np.median(sd / runs.mean(axis=0))), 3),
                "light_clients": len(clients),
                "table": _table_band([results[jittered[s, seed]] for seed in SEEDS]),
            }
        fig.suptitle("real trace: light clients' waits under 5 ms of arrival jitter (not in the paper)")
        save(fig, out / "real_ttft_spread.png")
        return numbers

    return Figure(
        "real_ttft_spread",
        "-",
        "real trace: spread of light clients' waits under arrival jitter",
        (*single.values(), *jittered.values()),
        draw,
    )


FIGURES = [_spread()]
