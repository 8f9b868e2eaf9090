"""The plain-Python summary `slora-vtc run` prints agrees with the numpy metrics the figures use."""

import math

import pytest

from slora_vtc import metrics, summary
from slora_vtc.cli.report import plain_table
from slora_vtc.cost import LinearCost, ProfiledCost
from slora_vtc.data import measured_run
from slora_vtc.experiment import Experiment
from slora_vtc.results import Response, RunResult, read_results
from slora_vtc.runner import run_experiment

RUNS = [
    {"suite": "overload", "scheduler": "vtc", "duration": 120},
    {"suite": "on_off_overload", "scheduler": "fcfs", "duration": 180},
    {"suite": "poisson_short_long_2", "scheduler": "vtc", "duration": 60},
    {"suite": "overload_weighted", "scheduler": "wvtc:1,2,3,4", "duration": 120},
    {"suite": "overload", "scheduler": "rpm:20", "duration": 120},  # rejected requests
    {"suite": "overload", "scheduler": "vtc", "duration": 200, "horizon": 150.0},  # aborted requests
    {"suite": "prefix_judge", "scheduler": "vtc", "prefix_cache": True, "admission": "optimistic", "horizon": 60.0},
]
WEIGHTS = {"client0": 1.0, "client1": 2.0, "client2": 3.0, "client3": 4.0}


def simulated(case: dict) -> RunResult:
    return run_experiment(Experiment.of(**case))


def measured(name: str) -> RunResult:
    return read_results(measured_run(name))[0]


def close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-9)


def check(result: RunResult, horizon: float, cost=LinearCost(), weights=None, offered=None) -> summary.FairnessSummary:
    ours = summary.fairness(result, horizon, cost, weights, offered)
    theirs = metrics.fairness_summary(result, horizon, cost, weights, offered)
    assert close(ours.max, theirs.max) and close(ours.avg, theirs.avg) and close(ours.var, theirs.var)
    assert summary.throughput(result) == metrics.throughput(result)  # integer sums: exactly
    assert close(summary.mean_response_time(result), metrics.mean_response_time(result))
    return theirs


@pytest.mark.parametrize("case", RUNS, ids=lambda c: f"{c['suite']}-{c['scheduler']}")
def test_simulated_runs(case):
    result = simulated(case)
    weights = WEIGHTS if case["scheduler"].startswith("wvtc") else None
    fair = check(result, float(result.config["duration"]), weights=weights)
    assert fair.max > 0 or case["scheduler"] == "rpm:20"  # (rpm: both clients held to the same rate)
    check(result, 600.0, ProfiledCost(), weights, offered=LinearCost())  # the paper's tables: profiled cost


@pytest.mark.parametrize("name", ["vtc_overload.jsonl", "fcfs_overload.jsonl"])
def test_the_artifacts_measured_runs(name):
    assert check(measured(name), 600.0).max > 0  # a run whose table says something


def test_the_printed_table_is_the_one_numpy_gives():
    """The table `slora-vtc run` prints, from both: the same text."""
    results = [simulated(c) for c in RUNS[:3]] + [measured("vtc_overload.jsonl")]

    def row(result, m) -> dict:
        fair = (summary.fairness if m is summary else metrics.fairness_summary)(result, 600.0)
        return {
            "max": fair.max,
            "avg": fair.avg,
            "var": fair.var,
            "tok/s": m.throughput(result),
            "TTFT": m.mean_response_time(result),
        }

    assert plain_table([row(r, summary) for r in results]) == plain_table([row(r, metrics) for r in results])


def test_a_run_without_a_finished_request():
    never = RunResult({}, 10.0, (Response("client0", 8, 8, 1.0, -1.0, -1.0, "rejected"),))
    assert summary.fairness(never, 600.0) == summary.FairnessSummary(0.0, 0.0, 0.0)
    assert summary.throughput(never) == 0.0 and math.isnan(summary.mean_response_time(never))
