"""The simulator against the artifact's measured runs (DESIGN sections 4 and 7)."""

import dataclasses

import numpy as np
import pytest
from conftest import a10g_profile, req

from slora_vtc import metrics
from slora_vtc.backends.sim import A10G_STEP_MODEL, SimBackend, StepTimeModel
from slora_vtc.calibrate import replay
from slora_vtc.experiment import Experiment, run_experiment
from slora_vtc.profile import load_profile
from slora_vtc.results import read_results


def test_step_times_follow_the_model():
    model = StepTimeModel(prefill_coef=(0.1, 0.01, 0.001), decode_coef=(0.02, 0.002, 0.0001), overhead_s=0.5)
    backend = SimBackend(model)
    reqs = [req("a", 10, 5), req("b", 30, 5)]
    assert backend.prefill(reqs).elapsed == pytest.approx(0.1 + 0.01 * 2 + 0.001 * 40 + 0.5)
    for r in reqs:
        r.generated = 3
    step = backend.decode(reqs)
    assert step.tokens == [None, None]
    assert step.elapsed == pytest.approx(0.02 + 0.002 * 2 + 0.0001 * (13 + 33) + 0.5)


def test_refit_on_the_shared_profile_reproduces_the_a10g_model():
    fitted = StepTimeModel.fit(load_profile(a10g_profile()))
    ours, theirs = dataclasses.asdict(fitted), dataclasses.asdict(A10G_STEP_MODEL)
    ours.pop("overhead_s"), theirs.pop("overhead_s")  # fitted separately, on a measured run
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-6), key


def test_profile_residuals_are_small_on_average():
    points = load_profile(a10g_profile())
    res = A10G_STEP_MODEL.residuals(points)
    assert len(res) == len(points)
    for errors in ([p for _, p, _ in res], [d for _, _, d in res]):  # prefill, decode
        assert np.sqrt(np.mean(np.square(errors))) < 0.15


@pytest.mark.parametrize("measured, scheduler", [("vtc_overload.jsonl", "vtc"), ("fcfs_overload.jsonl", "fcfs")])
def test_replaying_measured_runs_predicts_their_throughput(paper_results, measured, scheduler):
    run = read_results(paper_results(measured))[0]
    r = replay(A10G_STEP_MODEL, run, scheduler)
    assert 850 < r.measured < 900  # the artifact's measured tokens/s
    assert abs(r.error) < 0.10


@pytest.fixture(scope="module")
def overload():
    return {s: run_experiment(Experiment(suite="overload", scheduler=s)) for s in ("vtc", "fcfs")}


def steady_rates(result):
    """Mean service rate per client over the middle half of the arrival period."""
    rates = metrics.service_rate(result, np.linspace(150, 450, 31))
    return rates["client0"].mean(), rates["client1"].mean()


def test_overload_vtc_serves_both_clients_equally(overload):
    result = overload["vtc"]
    acc = metrics.accumulated_service(result, [600.0])
    assert acc["client0"][0] == pytest.approx(acc["client1"][0], rel=0.05)
    r0, r1 = steady_rates(result)
    assert r0 == pytest.approx(r1, rel=0.05)
    assert result.count("finished") == len(result.responses) == 2700


def test_overload_fcfs_serves_in_proportion_to_demand(overload):
    r0, r1 = steady_rates(overload["fcfs"])
    assert 1.7 < r1 / r0 < 2.3
    acc = metrics.accumulated_service(overload["fcfs"], [600.0])
    assert 1.7 < acc["client1"][0] / acc["client0"][0] < 2.3


def test_overload_throughput_is_the_measured_one(overload):
    for result in overload.values():
        assert metrics.throughput(result) == pytest.approx(890, rel=0.10)
        assert result.total_time > 600  # the backlog drains after the last arrival


def test_weighted_vtc_serves_in_proportion_to_the_weights():
    result = run_experiment(Experiment(suite="overload_weighted", scheduler="wvtc:1,2,3,4"))
    acc = metrics.accumulated_service(result, [360.0])
    shares = [acc[f"client{i}"][0] / acc["client0"][0] for i in range(4)]
    assert shares == pytest.approx([1, 2, 3, 4], rel=0.05)
