"""VTC's fairness bound (paper Theorem 4.4) on random backlogged workloads; FCFS breaks it.

Two clients that are both backlogged (always have waiting requests) must stay within
2 * max(w_p * max_input_len, w_q * M) of each other, M being the pool size in tokens: both in
VTC counters and in the service actually delivered (prompt at prefill, w_q per output token).
"""

from hypothesis import given, settings

from slora_vtc.request import State
from slora_vtc.sched import build_scheduler
from tests.helpers.engine import make_engine, req
from tests.helpers.workloads import two_backlogged_clients

POOL = 600
W_P, W_Q = 1, 2


def bound(requests) -> float:
    return 2 * max(W_P * max(r.prompt_len for r in requests), W_Q * POOL)


def run_backlogged(spec, requests):
    """Serve the requests; return per-step (counter difference, service difference) while both
    clients have waiting requests."""
    sched = build_scheduler(spec, ["a", "b"])
    engine = make_engine(sched, pool_tokens=POOL)
    diffs = []

    def delivered(client):
        return sum(W_P * r.prompt_len + W_Q * r.generated for r in requests if r.client == client and r.generated)

    def on_step():
        waiting = {r.client for r in requests if r.state is State.WAITING}
        if waiting == {"a", "b"}:
            counters = abs(sched.counter_of("a") - sched.counter_of("b")) if sched.traits.ledger else None
            diffs.append((counters, abs(delivered("a") - delivered("b"))))

    engine.run(requests, on_step=on_step)
    assert all(r.state is State.FINISHED for r in requests)
    return diffs


@settings(max_examples=25, deadline=None)
@given(two_backlogged_clients())
def test_vtc_keeps_backlogged_clients_within_the_bound(requests):
    limit = bound(requests)
    for counter_diff, service_diff in run_backlogged("vtc", requests):
        assert counter_diff <= limit
        assert service_diff <= limit


def two_to_one():
    """Client b sends twice as fast as a, both far above capacity (every arrival within 0.2 s)."""
    a = [req("a", 100, 100, 0.002 * k) for k in range(40)]
    b = [req("b", 100, 100, 0.001 * k + 0.0005) for k in range(80)]
    return a + b


def test_fcfs_service_difference_grows_past_the_bound():
    requests = two_to_one()
    diffs = [s for _, s in run_backlogged("fcfs", requests)]
    assert max(diffs) > 2 * bound(requests)
    assert diffs[-1] > diffs[len(diffs) // 2] > diffs[len(diffs) // 4]  # and keeps growing


def test_vtc_on_the_same_workload_stays_within_the_bound():
    requests = two_to_one()
    diffs = run_backlogged("vtc", requests)
    assert len(diffs) > 100
    assert max(s for _, s in diffs) <= bound(requests)
    assert max(c for c, _ in diffs) <= bound(requests)
