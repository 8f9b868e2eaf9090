"""The simulator against the artifact's measured runs (docs/design.md, "The simulator and its calibration")."""

import dataclasses

import numpy as np
import pytest

from slora_vtc import metrics
from slora_vtc.backends.sim import A10G_STEP_MODEL, TESTBEDS, SimBackend, StepTimeModel
from slora_vtc.calibrate import calibrate, compare, first_run, replay
from slora_vtc.experiment import Experiment
from slora_vtc.figures.calibration import prefill_batches
from slora_vtc.profile import load_profile
from slora_vtc.runner import run_experiment
from tests.helpers.engine import req
from tests.helpers.files import a10g_profile


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
    assert ours.pop("cached_coef") is theirs.pop("cached_coef") is None  # the profile has no prefix-hit points
    for key in ours:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-6), key


def test_profile_residuals_are_small_on_average():
    points = load_profile(a10g_profile())
    res = A10G_STEP_MODEL.residuals(points)
    assert len(res) == len(points)
    for errors in ([p for _, p, _ in res], [d for _, _, d in res]):  # prefill, decode
        assert np.sqrt(np.mean(np.square(errors))) < 0.15


@pytest.mark.parametrize(
    "testbed, measured, scheduler",
    [("a10g-2024", "vtc_overload.jsonl", "vtc"), ("a10g-2023", "fcfs_overload.jsonl", "fcfs")],
)
@pytest.mark.slow
def test_each_testbed_is_what_calibration_measures_on_its_reference_run(paper_results, testbed, measured, scheduler):
    """The shipped constants come from the documented procedure, run on the shipped data."""
    base = dataclasses.replace(A10G_STEP_MODEL, overhead_s=0.0, cold_start_s=0.0)
    assert calibrate(base, first_run(paper_results(measured)), scheduler) == TESTBEDS[testbed]


@pytest.mark.parametrize("added, matching", [(1, 325), (0, 8)])
def test_the_server_sees_each_prompt_one_token_longer(paper_results, added, matching):
    """The artifact's client sends prompt_len words and its server puts a BOS in front. With that
    one token the simulator admits the measured VTC run's requests in the measured prefill batches,
    all 325 of them in order (256-token prompts: 11 per mini-batch of at most 3072 tokens, not 12)."""
    measured = first_run(paper_results("vtc_overload.jsonl"))
    ours, theirs = (
        prefill_batches(replay(TESTBEDS["a10g-2024"], measured, "vtc", added_tokens=added)),
        prefill_batches(measured),
    )
    assert len(theirs) == 325
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    assert same == matching


def test_the_fcfs_run_matches_its_prefill_batches_until_its_own_irregularity(paper_results):
    measured = first_run(paper_results("fcfs_overload.jsonl"))
    ours, theirs = prefill_batches(replay(TESTBEDS["a10g-2023"], measured, "fcfs")), prefill_batches(measured)
    assert ours[:276] == theirs[:276]


@pytest.mark.parametrize(
    "testbed, measured, scheduler",
    [("a10g-2024", "vtc_overload.jsonl", "vtc"), ("a10g-2023", "fcfs_overload.jsonl", "fcfs")],
)
def test_a_testbed_reproduces_its_run_per_client(paper_results, testbed, measured, scheduler):
    c = compare(TESTBEDS[testbed], first_run(paper_results(measured)), scheduler)
    assert abs(c.throughput_error) < 0.01
    assert all(abs(e) < 0.02 for e in c.ttft_errors().values()) and len(c.ttft) == 2
    assert all(abs(m - s) < 0.005 for m, s in c.share.values())


@pytest.fixture(scope="module")
def overload():
    return {s: run_experiment(Experiment.of(suite="overload", scheduler=s)) for s in ("vtc", "fcfs")}


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
    result = run_experiment(Experiment.of(suite="overload_weighted", scheduler="wvtc:1,2,3,4"))
    acc = metrics.accumulated_service(result, [360.0])
    shares = [acc[f"client{i}"][0] / acc["client0"][0] for i in range(4)]
    assert shares == pytest.approx([1, 2, 3, 4], rel=0.05)
