"""Simulator speed: simulated requests per wall-clock second for a few paper suites, with
macro-steps (the default) and with single steps; the check that both give the same result file
on every suite; and the whole `slora-vtc run` process, start-up included."""

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from slora_vtc.experiment import Experiment
from slora_vtc.results import RunResult
from slora_vtc.runner import run_experiment
from slora_vtc.suites import SUITES

RUNS = (
    ("overload", "vtc"),
    ("overload", "fcfs"),
    ("ablation_65k_256", "vtc"),
    ("dist_shift", "lcf"),
)
CLI_COMMAND = ("run", "--suite", "overload", "--scheduler", "vtc")
CLI_TARGET_S = 0.5  # issue 11: the whole process
PAPER_SCHEDULERS = ("vtc", "fcfs", "lcf")
PREFIX_SCHEDULERS = ("lpm", "dlpm:8000", "vtc")
VARIANTS = (  # on overload: every other scheduler and setting that changes what a decode step does
    {"scheduler": "rpm:20"},
    {"scheduler": "vtc-pred:0.5"},
    {"scheduler": "vtc-oracle"},
    {"scheduler": "vtc-avg"},
    {"scheduler": "vtc", "cost": "profile"},
    {"scheduler": "vtc", "lift": "artifact"},
    {"scheduler": "vtc", "extra_charge_at_finish": True},
    {"scheduler": "vtc", "admission": "optimistic"},
    {"scheduler": "fcfs", "admission": "optimistic"},
    {"scheduler": "vtc", "prefix_cache": True},
    {"scheduler": "vtc", "horizon": 300.0},
)
CLUSTER = {"replicas": 4, "load_scale": 4, "duration": 120.0, "horizon": 120.0}  # on overload: each router kind
CLUSTER_VARIANTS = (
    {"router": "round-robin", "scheduler": "vtc"},
    {"router": "d2lpm:20000", "scheduler": "dlpm:8000"},
    {"router": "global-vtc", "scheduler": "vtc"},
    {"router": "global-vtc", "scheduler": "wvtc:4,1", "routers": 2, "router_sync": 5.0, "ingress_skew": 1.0},
    {"router": "global-vtc", "scheduler": "vtc", "batching": "chunked"},
)


def run(exp: Experiment, macro_steps: bool = True) -> RunResult:
    """run_experiment, with macro-steps on or off."""
    return run_experiment(exp, macro_steps=macro_steps)


def timed_run(exp: Experiment, macro_steps: bool = True) -> tuple[float, RunResult]:
    start = time.perf_counter()
    result = run(exp, macro_steps)
    return time.perf_counter() - start, result


def measure_sim_speed(repeats: int, progress: bool = True) -> list[dict]:
    """One row per (suite, scheduler) at the suite's own duration; wall time is the median."""
    rows = []
    with tqdm(
        total=len(RUNS) * (repeats + 1), desc="simulator speed", unit="run", disable=not progress, leave=False
    ) as bar:
        for suite, scheduler in RUNS:
            exp = Experiment.of(suite=suite, scheduler=scheduler)
            samples = []
            for _ in range(repeats):
                wall_s, result = timed_run(exp)
                samples.append(wall_s)
                bar.update()
            single_s, _ = timed_run(exp, macro_steps=False)
            bar.update()
            rows.append(speed_row(suite, scheduler, result, samples, single_s))
    return rows


def speed_row(suite: str, scheduler: str, result, samples: list[float], single_s: float) -> dict:
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
        "single_steps_wall_s": single_s,
        "macro_gain": single_s / wall_s,
    }


def check_cases() -> list[dict]:
    """Every suite under its schedulers (the prefix suites with the cache, ending with their
    arrivals as their figures do), every variant on overload, and overload on four replicas behind
    each kind of router."""
    cases = []
    for suite in SUITES.values():
        if suite.name.startswith("prefix"):
            cases += [
                {"suite": suite.name, "scheduler": s, "prefix_cache": True, "horizon": suite.duration}
                for s in PREFIX_SCHEDULERS
            ]
        elif suite.name == "overload_weighted":
            cases += [{"suite": suite.name, "scheduler": s} for s in ("wvtc:1,2,3,4", "vtc")]
        else:
            cases += [{"suite": suite.name, "scheduler": s} for s in PAPER_SCHEDULERS]
    cases += [{"suite": "overload", **v} for v in VARIANTS]
    cases += [{"suite": "overload", **CLUSTER, **v} for v in CLUSTER_VARIANTS]
    cases.append(
        {
            "suite": "prefix_tot",
            "scheduler": "dlpm:2000",
            "prefix_cache": True,
            "admission": "optimistic",
            "horizon": 90.0,
        }
    )
    cases.append(
        {
            "suite": "prefix_judge",
            "scheduler": "vtc",
            "prefix_cache": True,
            "admission": "optimistic",
            "charge_cached": 0.0,
            "horizon": 120.0,
        }
    )
    return cases


def check_macro_steps(progress: bool = True) -> dict:
    """Each case with macro-steps and with single steps: the result files must be byte for byte equal."""
    rows = []
    for case in tqdm(check_cases(), desc="macro-steps vs single steps", unit="run", disable=not progress, leave=False):
        exp = Experiment.of(**case)
        macro_s, macro = timed_run(exp)
        single_s, single = timed_run(exp, macro_steps=False)
        rows.append(
            {
                **case,
                "identical": macro.to_json() == single.to_json(),
                "requests": len(macro.responses),
                "wall_s": macro_s,
                "single_steps_wall_s": single_s,
            }
        )
    return {
        "cases": len(rows),
        "identical": sum(r["identical"] for r in rows),
        "wall_s": sum(r["wall_s"] for r in rows),
        "single_steps_wall_s": sum(r["single_steps_wall_s"] for r in rows),
        "rows": rows,
    }


def measure_cli(repeats: int) -> dict:
    """`python -m slora_vtc run --suite overload --scheduler vtc`, the whole process: wall time and
    the CPU time it used (user + system), each the median of `repeats` runs after an untimed one
    (Python allowed to write its bytecode cache, so that every timed run starts from it)."""
    walls, cpus = [], []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "slora_vtc", *CLI_COMMAND, "--out", str(Path(tmp) / "r.jsonl")]
        subprocess.run(command, check=True, capture_output=True, env=env)
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env)
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {
        "command": "slora-vtc " + " ".join(CLI_COMMAND),
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "min_wall_s": min(walls),
        "samples_s": walls,
        "cpu_samples_s": cpus,
        "target_s": CLI_TARGET_S,
    }
