"""Metrics (DESIGN section 7) on tiny hand-made results."""

import numpy as np
import pytest
from conftest import result_of

from slora_vtc import metrics
from slora_vtc.cost import ProfiledCost

# a: service 10 + 2 * 5 = 20 spread over [2, 6]; b: 4 + 2 * 3 = 10 over [2, 4]; the rejected one counts nowhere
TINY = result_of([
    ("a", 10, 5, 0.0, 2.0, 6.0),
    ("b", 4, 3, 1.0, 1.0, 3.0),
    ("b", 100, 100, 0.5, -1.0, -1.0, "rejected"),
], total_time=8.0)


def test_accumulated_service_is_spread_over_first_token_to_finish():
    acc = metrics.accumulated_service(TINY, [0, 2, 3, 4, 6, 10])
    assert acc["a"].tolist() == pytest.approx([0, 0, 5, 10, 20, 20])
    assert acc["b"].tolist() == pytest.approx([0, 0, 5, 10, 10, 10])


def test_accumulated_service_with_the_profiled_cost():
    h = ProfiledCost()
    acc = metrics.accumulated_service(TINY, [4, 100], cost=h)
    assert acc["a"].tolist() == pytest.approx([h(10, 5) / 2, h(10, 5)])


def test_service_rate_over_a_centred_window():
    rate = metrics.service_rate(TINY, [4.0], window=4.0)  # service in [2, 6] / 4
    assert rate["a"][0] == pytest.approx(5.0) and rate["b"][0] == pytest.approx(2.5)
    rate = metrics.service_rate(TINY, [3.0, 100.0])  # default 60 s window
    assert rate["a"].tolist() == pytest.approx([20 / 60, 0])


def test_service_difference():
    assert metrics.service_difference(TINY, [0, 3, 4, 6]).tolist() == pytest.approx([0, 0, 0, 10])


def test_throughput_counts_served_tokens_over_total_time():
    assert metrics.throughput(TINY) == pytest.approx((15 + 7) / 8.0)  # drain included: 8 s, not 6
    assert metrics.throughput(result_of([], 0.0)) == 0.0


def test_response_time():
    rt = metrics.response_time(TINY, [1.0, 500.0])
    assert rt["a"][0] == 2.0 and rt["b"][0] == 1.0  # the rejected request is excluded
    assert np.isnan(rt["a"][1])
    assert metrics.mean_response_time(TINY) == pytest.approx(1.5)


def test_fairness_summary_of_identical_clients_is_zero():
    rows = [(c, 60, 30, t, 1.0, 61.0) for c in ("a", "b") for t in range(0, 600, 30)]
    fair = metrics.fairness_summary(result_of(rows, 700.0), 600)
    assert (fair.max, fair.avg, fair.var) == pytest.approx((0, 0, 0))


def test_fairness_summary_counts_only_unmet_demand():
    # a: 120 of service over [30, 90]; b asked the same at t=30 and was rejected.
    # tick 30 (window [30, 90]): a got 2/s, b 0 while offering 2/s -> gap 2; later ticks: 0
    rows = [("a", 60, 30, 30.0, 0.0, 60.0), ("b", 60, 30, 30.0, -1.0, -1.0, "rejected")]
    fair = metrics.fairness_summary(result_of(rows, 600.0), 600)
    assert fair.max == pytest.approx(2.0)
    assert fair.avg == pytest.approx(2.0 / 20)
    assert fair.var == pytest.approx(4.0 / 20 - 0.1**2)


def test_fairness_summary_ignores_a_client_that_asked_for_less():
    rows = [("a", 60, 30, 30.0, 0.0, 60.0), ("b", 1, 1, 500.0, 0.0, 1.0)]
    fair = metrics.fairness_summary(result_of(rows, 600.0), 600)
    assert fair.max == pytest.approx(0.0, abs=1e-6)


def test_synthetic_ticks():
    assert metrics.synthetic_ticks(600).tolist() == [20.0 * i for i in range(31)]
