"""Metrics (docs/design.md, "Metrics") on tiny hand-made results and on the artifact's own outputs."""

import numpy as np
import pytest

from slora_vtc import metrics
from slora_vtc.cost import ProfiledCost
from tests.helpers.engine import result_of

# a: service 10 + 2 * 5 = 20 spread over [2, 6]; b: 4 + 2 * 3 = 10 over [2, 4]; the rejected one counts nowhere
TINY = result_of(
    [
        ("a", 10, 5, 0.0, 2.0, 6.0),
        ("b", 4, 3, 1.0, 1.0, 3.0),
        ("b", 100, 100, 0.5, -1.0, -1.0, "rejected"),
    ],
    total_time=8.0,
)


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


def test_fairness_summary_windows_and_unmet_demand_worked_by_hand():
    # horizon 600: windows [x, x + 60] for x = 28.5 i, i = 1..19.
    # a: 120 service over [30, 90] (2/s); b: 120 over [130, 160] (4/s); both sent at t = 30.
    # [28.5, 88.5]: a 58.5 * 2 / 60 = 1.95, b 0; both offered 2 -> gaps 0 + min(1.95, 2) = 1.95
    # [57, 117]: a 1.1, b 0, nothing offered -> 0 + min(1.1, 0) = 0
    # [85.5, 145.5]: a 4.5 * 2 / 60 = 0.15, b 15.5 * 4 / 60 -> min(b - a, 0.15) + 0 = 0.15
    # later windows: 0. A rejected request counts as never asked for (the artifact drops it).
    rows = [
        ("a", 60, 30, 30.0, 0.0, 60.0),
        ("b", 60, 30, 30.0, 100.0, 130.0),
        ("b", 500, 500, 30.0, -1.0, -1.0, "rejected"),
        ("c", 60, 30, 30.0, -1.0, -1.0, "rejected"),
    ]
    fair = metrics.fairness_summary(result_of(rows, 600.0), 600)
    gaps = np.array([1.95, 0, 0.15] + [0] * 16)
    assert (fair.max, fair.avg, fair.var) == pytest.approx((gaps.max(), gaps.mean(), gaps.var()))


def test_fairness_summary_with_weights_compares_service_per_weight():
    # a gets 400 of service over [0, 600], b 200: unfair unweighted, exactly fair with weights 2 : 1
    rows = [("a", 200, 100, 0.0, 0.0, 600.0), ("b", 100, 50, 0.0, 0.0, 600.0)]
    plain = metrics.fairness_summary(result_of(rows, 600.0), 600)
    weighted = metrics.fairness_summary(result_of(rows, 600.0), 600, weights={"a": 2.0, "b": 1.0})
    assert plain.avg > 0.3 and weighted.max == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(
    "measured, cost, expected",
    [
        # what the artifact's own plot_revision.py / plot_revision_profile.py print for these files
        ("vtc_overload.jsonl", "linear", (192.88, 103.77, 6981.24)),
        ("fcfs_overload.jsonl", "profile", (323.18, 317.13, 15.98)),
    ],
)
def test_fairness_summary_equals_the_artifacts_own_tables(paper_results, measured, cost, expected):
    from slora_vtc.cost import LinearCost
    from slora_vtc.results import read_results

    run = read_results(paper_results(measured))[0]
    h = ProfiledCost() if cost == "profile" else LinearCost()
    fair = metrics.fairness_summary(run, 600, h, offered_cost=LinearCost())  # the artifact prices demand linearly
    assert (round(fair.max, 2), round(fair.avg, 2), round(fair.var, 2)) == expected


def test_fairness_summary_ignores_a_client_that_asked_for_less():
    rows = [("a", 60, 30, 30.0, 0.0, 60.0), ("b", 1, 1, 500.0, 0.0, 1.0)]
    fair = metrics.fairness_summary(result_of(rows, 600.0), 600)
    assert fair.max == pytest.approx(0.0, abs=1e-6)


def test_synthetic_ticks():
    assert metrics.synthetic_ticks(600).tolist() == [20.0 * i for i in range(31)]
