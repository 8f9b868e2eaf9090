"""Simulator speed: simulated requests per wall-clock second for a few paper suites."""

import statistics
import time

from tqdm import tqdm

from slora_vtc.experiment import Experiment, run_experiment

RUNS = (
    ("overload", "vtc"),
    ("overload", "fcfs"),
    ("ablation_65k_256", "vtc"),
    ("dist_shift", "lcf"),
)


def timed_run(exp: Experiment) -> tuple[float, object]:
    start = time.perf_counter()
    result = run_experiment(exp)
    return time.perf_counter() - start, result


def measure_sim_speed(repeats: int, progress: bool = True) -> list[dict]:
    """One row per (suite, scheduler) at the suite's own duration; wall time is the median."""
    rows = []
    with tqdm(total=len(RUNS) * repeats, desc="simulator speed", unit="run", disable=not progress, leave=False) as bar:
        for suite, scheduler in RUNS:
            samples = []
            for _ in range(repeats):
                wall_s, result = timed_run(Experiment(suite=suite, scheduler=scheduler))
                samples.append(wall_s)
                bar.update()
            rows.append(speed_row(suite, scheduler, result, samples))
    return rows


def speed_row(suite: str, scheduler: str, result, samples: list[float]) -> dict:
    wall_s = statistics.median(samples)
    requests = len(result.responses)
    return {
        "suite": suite,
        "scheduler": scheduler,
        "duration_s": result.config["duration"],
        "requests": requests,
        "simulated_s": result.total_time,
        "wall_s": wall_s,
        "requests_per_s": requests / wall_s,
        "speedup": result.total_time / wall_s,
        "samples_s": samples,
    }
