"""LPM, DLPM and VTC on extend tokens: orders, skips, refills and charges worked out by hand on a
fake budget, the registry's specs, and DLPM's bounds (arXiv 2501.14312, Thm 4.1) on whole runs
with the prefix cache."""

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slora_vtc.backends.sim import sim_backend
from slora_vtc.cost import ProfiledCost
from slora_vtc.errors import UserError
from slora_vtc.request import Request, State
from slora_vtc.sched import DLPM, LPM, VTC, SchedulerOptions, build_scheduler
from tests.helpers.engine import run_engine
from tests.helpers.sched import FakeBudget, arrive, ids, reqs, rids, run_token


# -- LPM ---------------------------------------------------------------------------------------
def test_lpm_admits_the_longest_cached_prefix_first_ties_in_arrival_order():
    lpm = LPM()
    rs = reqs(("a", 50, 5), ("b", 50, 5), ("a", 50, 5), ("b", 50, 5))
    arrive(lpm, *rs)
    assert rids(lpm.select(FakeBudget({0: 5, 1: 20, 2: 20}), 0.0)) == [1, 2, 0, 3]
    assert lpm.num_waiting() == 0


def test_lpm_stops_at_the_first_request_that_does_not_fit():
    lpm = LPM()
    rs = reqs(("a", 10, 5), ("a", 100, 5), ("b", 100, 5))
    arrive(lpm, *rs)
    # order: 2 (cached 90, needs 10), 1 (cached 30, needs 70), 0 (needs 10): room 50 takes 2, not 1,
    # and 0, which would fit, is not offered
    budget = FakeBudget({1: 30, 2: 90}, room=50)
    assert rids(lpm.select(budget, 0.0)) == [2]
    assert budget.offered == [2, 1]
    assert lpm.waiting_by_client() == {"a": 2}
    assert rids(lpm.select(FakeBudget(), 0.0)) == [0, 1]  # the queue kept arrival order


@pytest.mark.parametrize("waiting, expected", [(3, [0, 1, 2]), (2, [1, 0])])
def test_lpm_falls_back_to_fcfs_above_n_waiting(waiting, expected):
    lpm = build_scheduler("lpm:2", [])
    rs = reqs(("a", 10, 5), ("a", 10, 5), ("a", 10, 5))[:waiting]
    arrive(lpm, *rs)
    budget = FakeBudget({1: 9})
    assert rids(lpm.select(budget, 0.0)) == expected
    # FCFS order matches nothing in advance: only what it admits is asked, for the prefill's charge
    assert budget.asked == (expected if waiting > 2 else [0, 1, *expected])


# -- VTC on extend tokens -------------------------------------------------------------------------
@pytest.mark.parametrize("weight, expected", [(1.0, 100), (0.5, 80), (0.0, 60)])
def test_vtc_charges_cached_prompt_tokens_at_their_weight(weight, expected):
    vtc = VTC(charge_cached=weight)
    (r,) = reqs(("a", 100, 5))
    arrive(vtc, r)
    budget = FakeBudget({0: 40})
    vtc.select(budget, 0.0)
    assert vtc.counter_of("a") == expected  # 60 uncached + weight * 40 cached
    assert budget.asked == [0]  # what is cached is asked once, for the prefill's charge
    run_token(r)
    vtc.on_decode_step([r], 0.0)
    assert vtc.counter_of("a") == expected + 2  # decode charges unchanged


def test_vtc_on_extend_tokens_prices_tokens_with_the_effective_input():
    """h(x, y) = x + 2 y + 0.5 x y; 60 of 100 prompt tokens uncached, cached ones free: x_eff = 60.
    Admission h(60, 0) = 60; token 2: h(60, 2) - h(60, 1) = 124 - 92 = 32; at finish nothing."""
    vtc = VTC(cost=ProfiledCost((1.0, 2.0, 0.5, 0.0, 0.0)), charge_cached=0.0)
    (r,) = reqs(("a", 100, 2))
    arrive(vtc, r)
    vtc.select(FakeBudget({0: 40}), 0.0)
    run_token(r)
    vtc.on_decode_step([r], 0.0)
    run_token(r)
    vtc.on_finish([r], [r], 0.0)
    assert vtc.counter_of("a") == pytest.approx(92)


def test_vtc_on_extend_tokens_gives_a_cached_client_more_requests():
    """a's prompt is 90% cached: on extend tokens a is charged 10 a request, b 100; after one each
    (a = 10, b = 100) a gets the next nine before b's second."""
    vtc = VTC(charge_cached=0.0)
    a = reqs(*[("a", 100, 1)] * 10)
    b = [Request("b", 100, 1, 0.5 + i, rid=100 + i) for i in range(2)]
    arrive(vtc, *a, *b)
    admitted = vtc.select(FakeBudget({r.rid: 90 for r in a}), 0.0)
    assert rids(admitted) == [0, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 101]


# -- DLPM --------------------------------------------------------------------------------------
def test_dlpm_refills_then_charges_extend_tokens_and_the_first_output_token():
    dlpm = DLPM(quantum=100)
    rs = reqs(("a", 50, 5), ("b", 30, 5))
    arrive(dlpm, *rs)
    assert dlpm.deficits() == {"a": 0, "b": 0}
    # both at 0: one refill to 100; LPM order b (10 cached), a; b: 100 - (20 + 2), a: 100 - (50 + 2)
    assert rids(dlpm.select(FakeBudget({1: 10}), 0.0)) == [1, 0]
    assert dlpm.deficits() == {"a": 48, "b": 78} and dlpm.refills == 1
    run_token(*rs)
    dlpm.on_decode_step(rs, 0.0)
    assert dlpm.deficits() == {"a": 46, "b": 76}
    assert dlpm.counters() == dlpm.deficits()


def test_dlpm_skips_a_client_without_credit_and_rescans_after_a_refill():
    """Q = 10. Refill: a = b = 10. LPM order 0, 1 (a, 40 cached), 2 (b). 0: a = 10 - 12 = -2.
    1: a has none but b, waiting, has: skip. 2: b = 10 - 7 = 3. Now only a waits, without credit:
    refill a (b > 0 gets none) to 8 and scan again: 1: a = 8 - 12 = -4."""
    dlpm = DLPM(quantum=10)
    rs = reqs(("a", 50, 3), ("a", 50, 3), ("b", 5, 3))
    arrive(dlpm, *rs)
    assert rids(dlpm.select(FakeBudget({0: 40, 1: 40}), 0.0)) == [0, 2, 1]
    assert dlpm.deficits() == {"a": -4, "b": 3} and dlpm.refills == 2


def test_dlpm_refills_until_a_waiting_client_has_credit():
    """Q = 5: a1 takes a from 5 to 5 - 12 = -7; two refills (-2, then 3) before a2: 3 - 12 = -9."""
    dlpm = DLPM(quantum=5)
    rs = reqs(("a", 10, 3), ("a", 10, 3))
    arrive(dlpm, *rs)
    assert rids(dlpm.select(FakeBudget(), 0.0)) == [0, 1]
    assert dlpm.deficits() == {"a": -9} and dlpm.refills == 3


def test_dlpm_hands_out_many_refills_at_once():
    """Q = 0.001 and a debt of 10,002 (a 10,000-token prompt): the 10,002,000 refills that a needs
    come in one go, b's stop once b is above 0, and nobody ends above Q."""
    dlpm = build_scheduler("dlpm:0.001", [])
    rs = reqs(("a", 10_000, 3), ("a", 10_000, 3), ("b", 5, 3))
    arrive(dlpm, *rs)
    assert rids(dlpm.select(FakeBudget(), 0.0)) == [0, 2, 1]
    assert dlpm.refills == 1 + 10_002_000
    deficits = dlpm.deficits()
    assert deficits["a"] == pytest.approx(0.001 - 10_002) and 0 < deficits["b"] <= 0.001


def test_dlpm_stops_at_the_first_request_with_credit_that_does_not_fit():
    dlpm = DLPM(quantum=1000)
    rs = reqs(("a", 100, 3), ("b", 10, 3))
    arrive(dlpm, *rs)
    budget = FakeBudget(room=50)
    assert dlpm.select(budget, 0.0) == []
    assert budget.offered == [0] and dlpm.num_waiting() == 2
    assert dlpm.deficits() == {"a": 1000, "b": 1000}  # refilled, nothing charged


def test_dlpm_idle_client_keeps_its_debt_loses_its_credit_and_gets_no_refill():
    dlpm = DLPM(quantum=10)
    a1, b1, b2 = reqs(("a", 20, 1), ("b", 1, 1), ("b", 30, 1))
    arrive(dlpm, a1, b1)
    dlpm.select(FakeBudget(), 0.0)  # refill both to 10; a1: 10 - 22 = -12; b1: 10 - 3 = 7
    assert dlpm.deficits() == {"a": -12, "b": 7}
    run_token(a1, b1)
    dlpm.on_finish([a1, b1], [a1, b1], 0.0)
    assert dlpm.deficits() == {"a": -12, "b": 0}  # both idle: debt kept, credit dropped
    arrive(dlpm, b2)
    assert rids(dlpm.select(FakeBudget(), 0.0)) == [2]  # only b is refilled: 10 - 32 = -22
    assert dlpm.deficits() == {"a": -12, "b": -22}


def test_dlpm_serves_both_clients_in_proportion_to_extend_tokens():
    """a's requests are 90% cached (extend 10 + first token 2 = 12), b's cold (100 + 2 = 102),
    Q = 102. Refill 1 (a = b = 102): a takes 9 (down to 6, then -6), then b one (0); refill 2
    (a = 96, b = 102): a 8 (to 0), b one; refill 3: a 9, b one; refill 4 (a = 96): a's last 4
    (to 48), b one; refill 5 (b only; a, still running, has credit): b's last."""
    dlpm = DLPM(quantum=102)
    a = reqs(*[("a", 100, 1)] * 30)
    b = [Request("b", 100, 1, 100 + i, rid=100 + i) for i in range(5)]
    arrive(dlpm, *a, *b)
    admitted = dlpm.select(FakeBudget({r.rid: 90 for r in a}), 0.0)
    assert "".join(r.client for r in admitted) == "a" * 9 + "b" + "a" * 8 + "b" + "a" * 9 + "b" + "a" * 4 + "bb"
    assert rids(admitted) == list(range(9)) + [100] + list(range(9, 17)) + [101] + list(range(17, 26)) + [102] + list(
        range(26, 30)
    ) + [103, 104]
    assert dlpm.deficits() == {"a": 48, "b": 0} and dlpm.refills == 5


# -- the registry ----------------------------------------------------------------------------------
def test_registry_builds_lpm_and_dlpm():
    assert build_scheduler("lpm", []).fcfs_above is None
    assert build_scheduler("lpm:128", []).fcfs_above == 128
    dlpm = build_scheduler("dlpm:8000", [], SchedulerOptions(charge_recompute=True))
    assert isinstance(dlpm, DLPM) and dlpm.quantum == 8000 and dlpm.charge_recompute
    assert build_scheduler("dlpm:2.5", []).quantum == 2.5
    vtc = build_scheduler("vtc", [], SchedulerOptions(charge_cached=0.25, charge_recompute=True))
    assert vtc.charge_cached == 0.25 and vtc.charge_recompute
    assert build_scheduler("wvtc:1,2", ["a", "b"], SchedulerOptions(charge_cached=0.0)).charge_cached == 0.0


@pytest.mark.parametrize(
    "spec, message",
    [
        ("dlpm:0", "'dlpm:0': the quantum must be positive"),
        ("dlpm:-5", "'dlpm:-5': the quantum must be positive"),
        ("dlpm:x", "'dlpm:x': the quantum 'x' is not a number"),
        ("dlpm:inf", "must be positive and finite"),
        ("dlpm", "needs an argument: dlpm:Q"),
        ("lpm:0", "'lpm:0': the FCFS fallback threshold must be positive, got 0"),
        ("lpm:x", "'lpm:x': 'x' is not an integer"),
        ("lpm:", "the argument after ':' is missing"),
    ],
)
def test_bad_prefix_scheduler_specs_raise_user_error(spec, message):
    with pytest.raises(UserError, match=message):
        build_scheduler(spec, ["a", "b"])


@pytest.mark.parametrize("weight", [1.5, -0.1, float("nan")])
def test_charge_cached_outside_zero_one_is_a_user_error(weight):
    with pytest.raises(UserError, match=r"--charge-cached must be in \[0, 1\], got"):
        SchedulerOptions(charge_cached=weight)


def test_usage_shows_an_optional_argument():
    from slora_vtc.sched import SCHEDULERS

    assert [SCHEDULERS[n].usage(n) for n in ("vtc", "rpm", "lpm", "dlpm")] == ["vtc", "rpm:LIMIT", "lpm:[N]", "dlpm:Q"]


# -- DLPM's bounds on whole runs with the prefix cache ---------------------------------------------
W_E, W_Q = 1, 2


@dataclass
class Observed:
    """What a run showed after every step: deficits, and the service W = w_e * extend + w_q * output
    of each client while both had a request waiting."""

    deficits: list[dict[str, float]] = field(default_factory=list)
    service_gaps: list[float] = field(default_factory=list)
    most_output_running: int = 0  # M: the most output tokens (max_new_tokens) of one client's requests running together


def run_observed(spec: str, requests: list[Request], pool: int) -> Observed:
    sched = build_scheduler(spec, ["a", "b"])
    seen = Observed()
    extend: dict[int, int] = {}  # rid -> extend tokens of its first prefill (a preemption's second one is not charged)

    def served(client: str) -> float:
        return sum(W_E * extend[r.rid] + W_Q * r.generated for r in requests if r.client == client and r.generated)

    def on_step(engine):
        for r in requests:
            if r.generated and r.rid not in extend:
                extend[r.rid] = r.prompt_len - r.cached_len
        if isinstance(sched, DLPM):
            seen.deficits.append(sched.deficits())
        for client in "ab":
            running = sum(r.max_new_tokens for r in engine.running if r.client == client)
            seen.most_output_running = max(seen.most_output_running, running)
        if {r.client for r in requests if r.state is State.WAITING} == {"a", "b"}:
            seen.service_gaps.append(abs(served("a") - served("b")))

    run_engine(sched, requests, sim_backend(), on_step=on_step, pool_tokens=pool, prefix_cache=True)
    assert all(r.state is State.FINISHED for r in requests)
    return seen


def headroom(requests: list[Request], seen: Observed) -> float:
    """U = w_e * L_input + w_q * M: L_input the largest prompt (the most one admission charges for
    extend tokens), M the most output tokens one client's running requests were to produce (all
    that can be charged to a client after its last admission with credit; every request here has
    at least 2 output tokens, so each is seen running after its prefill)."""
    return W_E * max(r.prompt_len for r in requests) + W_Q * seen.most_output_running


CLIENT_SHAPE = st.tuples(
    st.integers(0, 200),  # system prompt
    st.lists(st.integers(0, 300), min_size=1, max_size=3),  # documents
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 60), st.integers(2, 120)), min_size=20, max_size=80
    ),  # (doc, question, output)
)


def prefix_requests(shapes, order_seed: int) -> list[Request]:
    """Two clients, all requests at t = 0 (both backlogged from the start): each client's prompts
    are its system prompt + one of its documents + a question of its own."""
    requests, question = [], 1
    for c, (client, (system_len, doc_lens, asks)) in enumerate(zip("ab", shapes)):
        system, docs = ids(c, 0, system_len), [ids(c, 1 + j, n) for j, n in enumerate(doc_lens)]
        for doc, q_len, out in asks:
            prompt = system + docs[doc % len(docs)] + ids(c, 100 + question, q_len)
            question += 1
            requests.append(Request(client, len(prompt), out, 0.0, prompt_ids=prompt))
    random.Random(order_seed).shuffle(requests)
    return requests


@settings(max_examples=30, deadline=None)
@given(
    st.tuples(CLIENT_SHAPE, CLIENT_SHAPE),
    st.integers(0, 1000),
    st.sampled_from([50, 300, 1500, 6000]),
    st.integers(1200, 3000),
)
def test_dlpm_keeps_its_invariant_and_two_backlogged_clients_within_2_u_plus_q(shapes, order_seed, quantum, pool):
    requests = prefix_requests(shapes, order_seed)
    seen = run_observed(f"dlpm:{quantum}", requests, pool)
    u = headroom(requests, seen)
    for deficits in seen.deficits:
        assert all(-u < q <= quantum for q in deficits.values()), (deficits, u, quantum)
    assert max(seen.service_gaps, default=0) <= 2 * (u + quantum)


def flooding_client() -> list[Request]:
    """S1 (a misbehaving client sends more requests): a sends 600 requests on one 1,000-token
    system prompt, b 60 cold 300-token prompts; all at t = 0, 20 output tokens each."""
    system = ids(0, 0, 1000)
    a = [Request("a", 1020, 20, 0.0, prompt_ids=system + ids(0, 1 + i, 20)) for i in range(600)]
    b = [Request("b", 300, 20, 0.0, prompt_ids=ids(1, 1 + i, 300)) for i in range(60)]
    return a + b


def test_lpm_breaks_the_bound_on_a_flooding_client_and_dlpm_keeps_it():
    quantum, pool = 500, 4000
    lpm, dlpm = run_observed("lpm", flooding_client(), pool), run_observed(f"dlpm:{quantum}", flooding_client(), pool)
    requests = flooding_client()
    bound = 2 * (max(headroom(requests, lpm), headroom(requests, dlpm)) + quantum)
    assert max(dlpm.service_gaps) <= bound
    assert max(lpm.service_gaps) > 2 * bound  # b waits while a's cached requests go first
    assert lpm.service_gaps[-1] == max(lpm.service_gaps)  # and the gap only grows


# prefix_chat_s2 is left out: there the flooder's histories are only longer, its share stays near half
# under LPM too (docs/beyond.md), and LPM does not break the bound
MISBEHAVING = [
    f"prefix_{w}_{v}" for w in ("qa", "tot", "judge", "chat") for v in ("s1", "s2") if (w, v) != ("chat", "s2")
]


def dlpm_service(result) -> dict[str, float]:
    """W = w_e * extend tokens + w_q * output tokens of the finished requests, per client (the
    result file's prompt_len leaves out the BOS the serving path adds: + 1)."""
    service = dict.fromkeys(result.clients, 0.0)
    for r in result.responses:
        if r.status == "finished":
            service[r.client] += (r.prompt_len + 1 - r.cached_tokens) + 2 * r.output_len
    return service


@pytest.mark.parametrize("suite", MISBEHAVING)
@pytest.mark.slow
def test_on_the_misbehaving_client_suites_lpm_breaks_the_bound_and_dlpm_keeps_it(suite):
    """Both clients are backlogged until the arrivals end (test_prefix_suites.py), where the runs stop.
    U = w_e * L_input + w_q * M with M at most the pool (no batch holds more tokens): a bound on
    DLPM's 2 (U + Q) that holds for any batch, so LPM exceeding it is a real break."""
    from slora_vtc.experiment import Experiment
    from slora_vtc.runner import run_experiment
    from slora_vtc.suites import SUITES

    q, duration, pool = 8000, SUITES[suite].duration, SUITES[suite].pool_tokens
    gaps, bound = {}, None
    for scheduler in ("lpm", f"dlpm:{q}"):
        result = run_experiment(Experiment.of(suite=suite, scheduler=scheduler, prefix_cache=True, horizon=duration))
        w = dlpm_service(result)
        gaps[scheduler] = abs(w["client0"] - w["client1"])
        u = max(r.prompt_len + 1 for r in result.responses) + 2 * pool
        bound = 2 * (u + q)
    assert gaps["lpm"] > bound > gaps[f"dlpm:{q}"]
