"""Schedulers under preemption (issue 10, item 5): where a preempted request waits again, who is
the victim, what is charged for it (worked out by hand on a fake budget), and on whole runs with
optimistic admission: every request ends once and the counters add up."""

import random

import pytest

from slora_vtc.builder import build_engine
from slora_vtc.clock import VirtualClock
from slora_vtc.cluster.router_group import RouterGroup
from slora_vtc.config import EngineConfig
from slora_vtc.request import Request, State
from slora_vtc.sched import DLPM, FCFS, LPM, RPM, VTC, RateLimited, SchedulerOptions, build_scheduler
from slora_vtc.sched.prompt_charge import PromptProgress
from slora_vtc.sched.victims import may_preempt, victims_last
from slora_vtc.sched.vtc_predict import OraclePredictor, PredictingVTC
from tests.helpers.engine import FixedBackend, run_engine
from tests.helpers.sched import FakeBudget, Plain, arrive, ids, reqs, rids, run_token


def admit(sched, budget=None):
    return sched.select(budget or FakeBudget(), 0.0)


# -- FCFS, RPM, LPM -------------------------------------------------------------------------------
def test_fcfs_puts_preempted_requests_back_in_arrival_order():
    fcfs = FCFS()
    rs = reqs(*[("a", 10, 5)] * 4)
    arrive(fcfs, *rs)
    assert rids(admit(fcfs, FakeBudget(room=20))) == [0, 1]
    run_token(rs[0], rs[1])
    assert fcfs.choose_victim([rs[0], rs[1]], 0.0) is rs[1]  # the latest arrival
    fcfs.on_preempt(rs[1], 0.0)
    fcfs.on_preempt(rs[0], 0.0)
    assert fcfs.num_waiting() == 4
    assert rids(admit(fcfs)) == [0, 1, 2, 3]


def test_victim_ties_on_arrival_go_to_the_larger_rid():
    a, b = Request("a", 1, 1, 5.0, rid=7), Request("b", 1, 1, 5.0, rid=3)
    assert FCFS().choose_victim([a, b], 0.0) is a


def test_rate_limited_delegates_preemption_and_does_not_count_it_as_an_arrival():
    rpm = RPM(limit=2)
    a1, a2, a3 = reqs(("a", 10, 5), ("a", 10, 5), ("a", 10, 5))
    assert rpm.traits.preemption and not RateLimited(Plain(), {}).traits.preemption
    assert rpm.on_arrival(a1, 0.0)
    admit(rpm)
    run_token(a1)
    rpm.on_preempt(a1, 1.0)
    assert rpm.num_waiting() == 1
    assert rpm.on_arrival(a2, 2.0) and not rpm.on_arrival(a3, 3.0)  # a1 counted once
    assert rpm.choose_victim([a1, a2], 0.0) is a2


def test_lpm_puts_a_preempted_request_back_and_its_cached_prefix_puts_it_first():
    lpm = LPM()
    rs = reqs(*[("a", 100, 50)] * 3)
    arrive(lpm, *rs)
    assert rids(admit(lpm, FakeBudget(room=100))) == [0]
    run_token(rs[0])
    lpm.on_preempt(rs[0], 0.0)
    assert rids(lpm.drain()) == [0, 1, 2]  # arrival order
    arrive(lpm, *rs[1:])
    lpm.on_preempt(rs[0], 0.0)
    assert rids(admit(lpm, FakeBudget({0: 100}, room=1))) == [0]  # 101 tokens, 100 cached


# -- VTC ---------------------------------------------------------------------------------------------
def test_vtc_takes_a_preempted_request_back_without_a_lift_or_a_second_admission_charge():
    """a1 (10) and b1 (50) are admitted: a = 10, b = 50; b2 waits. a1 is preempted after its
    prefill, before any decode step charged it: no lift to b's 50, so a (10) goes first; its second
    prefill yields token 2, charged 2, as the decode step it replaces would have been."""
    vtc = VTC()
    a1, b1, b2 = reqs(("a", 10, 5), ("b", 50, 5), ("b", 50, 5))
    arrive(vtc, a1, b1, b2)
    assert rids(admit(vtc, FakeBudget(room=60))) == [0, 1]
    run_token(a1, b1)
    vtc.on_preempt(a1, 0.0)
    assert vtc.counters() == {"a": 10, "b": 50} and vtc.waiting_by_client() == {"a": 1, "b": 1}
    assert rids(admit(vtc)) == [0, 2]
    assert vtc.counters() == {"a": 12, "b": 100}


def serve_to_the_end(vtc, r):
    while not r.done:
        vtc.on_decode_step([r], 0.0)
        run_token(r)
    vtc.on_finish([r], [r], 0.0)


def test_vtc_charges_a_preempted_request_what_an_unpreempted_one_costs():
    """Preempted after its decode step charged token 2, before the token came: the second
    prefill's token 2 is not charged again. 10 + 2 * (5 - 1) = 18 either way."""
    vtc = VTC()
    (r,) = reqs(("a", 10, 5))
    arrive(vtc, r)
    admit(vtc)
    run_token(r)
    vtc.on_decode_step([r], 0.0)  # token 2 charged: 12
    vtc.on_preempt(r, 0.0)
    admit(vtc)
    assert vtc.counter_of("a") == 12
    run_token(r)  # the second prefill yields token 2
    serve_to_the_end(vtc, r)
    assert vtc.counter_of("a") == 18 and vtc.records == {}


@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_vtc_charge_recompute_charges_the_recomputed_tokens_as_input(weight):
    """Prompt 10, 3 tokens generated when preempted; 4 tokens cached at its second admission: it
    computes again 10 + 3 - 1 - 4 = 8 tokens (its newest token's K/V was never computed).
    Charges: 10 + 2 + 2 (tokens 2, 3) + 8 + 2 (token 4) = 24, divided by the client's weight."""
    vtc = VTC(weights={"a": weight}, charge_recompute=True)
    (r,) = reqs(("a", 10, 5))
    arrive(vtc, r)
    admit(vtc)
    run_token(r)
    for _ in range(2):
        vtc.on_decode_step([r], 0.0)
        run_token(r)
    vtc.on_preempt(r, 0.0)
    admit(vtc, FakeBudget({0: 4}))
    assert vtc.counter_of("a") == 24 / weight


def test_vtc_victim_is_the_latest_arrival_of_the_client_with_the_largest_counter():
    vtc = VTC()
    a1, b1, a2, b2 = reqs(("a", 100, 5), ("b", 50, 5), ("a", 10, 5), ("b", 10, 5))
    arrive(vtc, a1, b1, a2, b2)
    admit(vtc)  # a1 (a = 100), b1 (b = 50), b2 (b = 60), a2 (a = 110)
    assert vtc.counters() == {"a": 110, "b": 60}
    assert vtc.choose_victim([a1, b1, a2, b2], 0.0) is a2
    assert vtc.choose_victim([a1, b1, b2], 0.0) is a1
    assert build_scheduler("wvtc:1,4", ["a", "b"]).choose_victim([a1, b1], 0.0) is b1  # ties (0, 0): latest arrival


@pytest.mark.parametrize("end", ["remove", "drain"])
def test_vtc_settles_a_preempted_request_that_ends_while_waiting(end):
    """Oracle: h(10, 5) = 20 up front; preempted with 2 tokens and then aborted while waiting:
    refunded down to h(10, 2) = 14, and nothing is kept for it."""
    vtc = PredictingVTC(OraclePredictor())
    (r,) = reqs(("a", 10, 5))
    arrive(vtc, r)
    admit(vtc)
    run_token(r)
    vtc.on_decode_step([r], 0.0)
    run_token(r)
    vtc.on_preempt(r, 0.0)
    assert vtc.remove(r) if end == "remove" else vtc.drain() == [r]
    assert vtc.counter_of("a") == 14 and vtc.records == {} and vtc.num_waiting() == 0


@pytest.mark.parametrize("end", ["remove", "drain"])
def test_vtc_forgets_a_request_preempted_mid_prompt_that_ends_while_waiting(end):
    """Chunked batching: 4 of a 10-token prompt computed (charged h(4, 0) = 4), preempted before its
    first token, then aborted while waiting: the charge stays (as for an aborted running request),
    and nothing is kept for it (a record left behind would count its client as served forever)."""
    vtc = VTC()
    (r,) = reqs(("a", 10, 5))
    arrive(vtc, r)
    vtc.pop(r, 0.0)
    PromptProgress(cached=0).report(vtc, r, 4, 0.0)
    vtc.on_preempt(r, 0.0)
    assert vtc.remove(r) if end == "remove" else vtc.drain() == [r]
    assert vtc.counter_of("a") == 4 and vtc.records == {} and vtc.num_waiting() == 0


# -- DLPM --------------------------------------------------------------------------------------------
def test_dlpm_readmits_a_preempted_request_charging_its_next_token_and_recompute_only_if_asked():
    """Q = 100: admitted at 100 - (30 + 2) = 68; token 2 charged: 66; preempted with 2 tokens;
    readmitted with 20 cached: token 3 charged (64), and with charge_recompute its 30 + 2 - 1 - 20
    = 11 recomputed tokens too (53)."""
    for recompute, expected in [(False, 64), (True, 53)]:
        dlpm = DLPM(quantum=100, charge_recompute=recompute)
        (r,) = reqs(("a", 30, 5))
        arrive(dlpm, r)
        admit(dlpm)
        run_token(r)
        dlpm.on_decode_step([r], 0.0)
        run_token(r)
        dlpm.on_preempt(r, 0.0)
        assert dlpm.waiting_by_client() == {"a": 1}
        assert rids(admit(dlpm, FakeBudget({0: 20}))) == [0]
        assert dlpm.deficits() == {"a": expected}


def test_dlpm_readmits_a_preempted_request_only_with_credit():
    """Q = 40: a1 (30 + 2) takes a to 8, b1 (10 + 2) b to 28; a1's decode steps take a to -2. a1
    is preempted: b has credit, so a1 is passed over while b2 and b3 are offered."""
    dlpm = DLPM(quantum=40)
    a1, b1, b2, b3 = reqs(("a", 30, 9), ("b", 10, 9), ("b", 10, 9), ("b", 10, 9))
    arrive(dlpm, a1, b1)
    admit(dlpm)
    run_token(a1, b1)
    for _ in range(5):
        dlpm.on_decode_step([a1], 0.0)
        run_token(a1)
    assert dlpm.deficits() == {"a": -2, "b": 28}
    assert dlpm.choose_victim([a1, b1], 0.0) is a1  # the lowest deficit
    dlpm.on_preempt(a1, 0.0)
    arrive(dlpm, b2, b3)
    budget = FakeBudget(room=10)
    assert rids(admit(dlpm, budget)) == [2]  # b: 28 - 12 = 16; then b3 does not fit
    assert budget.offered == [2, 3]  # a1, first in arrival order, was not offered
    assert dlpm.deficits() == {"a": -2, "b": 16}


def test_dlpm_forgets_a_preempted_request_aborted_while_waiting():
    dlpm = DLPM(quantum=100)
    (r,) = reqs(("a", 30, 5))
    arrive(dlpm, r)
    admit(dlpm)
    run_token(r)
    dlpm.on_preempt(r, 0.0)
    assert dlpm.remove(r) and not dlpm.remove(r)
    assert dlpm._charged == {} and dlpm.num_waiting() == 0
    assert dlpm.deficits() == {"a": 0}  # idle: its credit (68) is dropped


# -- whole runs with optimistic admission ----------------------------------------------------------
CLIENTS = ["a", "b", "c"]


def workload(seed: int, prefix: bool, spread: float = 0.0) -> list[Request]:
    """20 requests per client; with `prefix`, each client's prompts start with one of its two
    documents. All at t = 0 unless `spread` (arrivals uniform in [0, spread])."""
    rng = random.Random(seed)
    out = []
    for c, client in enumerate(CLIENTS):
        for i in range(20):
            head = ids(c, 1 + rng.randrange(2), rng.randrange(50, 300)) if prefix else []
            prompt = head + ids(c, 100 + i, rng.randrange(5, 100))
            arrival = rng.uniform(0, spread) if spread else 0.0
            out.append(
                Request(client, len(prompt), rng.randrange(20, 300), arrival, prompt_ids=prompt if prefix else None)
            )
    return out


def serve(
    spec: str, requests: list[Request], admission: str, prefix: bool, options=SchedulerOptions(), pool: int = 1500
):
    """Run to the end; return the scheduler, each request's first-prefill cached tokens, and
    every deficit map DLPM had after a step."""
    sched = build_scheduler(spec, CLIENTS, options)
    first_cached: dict[int, int] = {}
    deficits: list[dict[str, float]] = []
    most_output_running = [0]

    def on_step(engine):
        for r in requests:
            if r.generated and r.rid not in first_cached:
                first_cached[r.rid] = r.cached_len
        if isinstance(sched, DLPM):
            deficits.append(sched.deficits())
        for client in CLIENTS:
            running = sum(r.max_new_tokens for r in engine.running if r.client == client)
            most_output_running[0] = max(most_output_running[0], running)

    engine, ended = run_engine(
        sched, requests, on_step=on_step, pool_tokens=pool, prefix_cache=prefix, admission=admission
    )
    assert sorted(r.rid for r in ended) == sorted(r.rid for r in requests)  # every request ends once
    assert all(r.state is State.FINISHED and r.generated == r.max_new_tokens for r in requests)
    engine.memory.flush()
    assert engine.memory.pool.num_free == pool and not engine.running and sched.num_waiting() == 0
    inner = sched.inner if isinstance(sched, RateLimited) else sched
    assert getattr(inner, "records", {}) == {} and getattr(inner, "_charged", {}) == {}  # nothing kept per request
    return sched, first_cached, deficits, most_output_running[0]


@pytest.mark.parametrize(
    "spec",
    [
        "fcfs",
        "rpm:1000",
        "vtc",
        "lcf",
        "wvtc:1,2,3",
        "vtc-oracle",
        "vtc-pred:0.5",
        "vtc-avg",
        "lpm",
        "lpm:8",
        "dlpm:400",
    ],
)
@pytest.mark.parametrize("prefix", [False, True])
def test_every_scheduler_serves_every_request_once_under_preemption(spec, prefix):
    requests = workload(1, prefix, spread=30.0)
    serve(spec, requests, "optimistic", prefix)
    assert sum(r.preemptions for r in requests) > 0 and sum(r.recomputed for r in requests) > 0


def expected_vtc_counters(requests, first_cached, charge_cached=1.0, recompute=False, weights=None):
    """Plain VTC's charges summed by hand: per request h(x_eff, 0) + 2 per token after the first
    (x_eff = prompt - (1 - charge_cached) * cached at its first prefill), + its recomputed tokens
    (the engine's own count) with charge_recompute; divided by the client's weight."""
    out = dict.fromkeys(CLIENTS, 0.0)
    for r in requests:
        x_eff = r.prompt_len - (1 - charge_cached) * first_cached[r.rid]
        out[r.client] += (x_eff + 2 * (r.max_new_tokens - 1) + (r.recomputed if recompute else 0)) / (
            weights or {}
        ).get(r.client, 1)
    return out


@pytest.mark.parametrize("spec, weights", [("vtc", None), ("lcf", None), ("wvtc:1,2,4", {"a": 1, "b": 2, "c": 4})])
@pytest.mark.parametrize("recompute", [False, True])
def test_vtc_counters_add_up_under_preemption(spec, weights, recompute):
    """All requests arrive at t = 0, so no lift ever moves a counter: each client's counter is the
    sum of its requests' charges, whatever the schedule and however often they were preempted."""
    requests = workload(2, prefix=False)
    sched, first_cached, _, _ = serve(spec, requests, "optimistic", False, SchedulerOptions(charge_recompute=recompute))
    assert sum(r.preemptions for r in requests) > 0
    assert sched.counters() == pytest.approx(
        expected_vtc_counters(requests, first_cached, recompute=recompute, weights=weights)
    )


@pytest.mark.parametrize("charge_cached", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("recompute", [False, True])
def test_vtc_on_extend_tokens_counters_add_up_with_the_prefix_cache_and_preemption(charge_cached, recompute):
    requests = workload(3, prefix=True)
    options = SchedulerOptions(charge_cached=charge_cached, charge_recompute=recompute)
    sched, first_cached, _, _ = serve("vtc", requests, "optimistic", True, options)
    assert sum(r.preemptions for r in requests) > 0 and sum(first_cached.values()) > 0
    assert sched.counters() == pytest.approx(expected_vtc_counters(requests, first_cached, charge_cached, recompute))


def test_without_charge_recompute_preemption_changes_no_vtc_counter():
    conservative, _, _, _ = serve("vtc", workload(4, prefix=False), "conservative", False)
    requests = workload(4, prefix=False)
    optimistic, _, _, _ = serve("vtc", requests, "optimistic", False)
    assert sum(r.preemptions for r in requests) > 0
    assert optimistic.counters() == conservative.counters()


@pytest.mark.parametrize("recompute", [False, True])
def test_dlpm_invariant_holds_under_preemption(recompute):
    """-U < q <= Q after every step; U = w_e * L + w_q * M, L the most one admission charges as
    input (the prompt; with charge_recompute a whole prefill, prompt + output), M the most output
    tokens of one client's requests running at once."""
    quantum = 400
    requests = workload(5, prefix=True, spread=20.0)
    _, _, deficits, m = serve(
        f"dlpm:{quantum}", requests, "optimistic", True, SchedulerOptions(charge_recompute=recompute)
    )
    assert sum(r.preemptions for r in requests) > 0
    longest = max(r.prompt_len + (r.max_new_tokens if recompute else 0) for r in requests)
    u = longest + 2 * m
    assert all(-u < q <= quantum for d in deficits for q in d.values())


def test_an_engine_refuses_optimistic_admission_for_a_scheduler_without_preemption():
    from slora_vtc.errors import UserError

    with pytest.raises(UserError, match="cannot take preempted requests back"):
        build_engine(EngineConfig(admission="optimistic"), RateLimited(Plain(), {}), FixedBackend(), VirtualClock())
    build_engine(EngineConfig(admission="optimistic"), RateLimited(FCFS(), {}), FixedBackend(), VirtualClock())


# -- the order of victims (sched/victims.py) --------------------------------------------------------
def _running_with_counters(sched, rng: random.Random) -> list[Request]:
    """Requests of clients a, b, c (arrival ties included) that arrived and run, the clients' counters random."""
    running = [Request(rng.choice("abc"), 4, 4, float(rng.randint(0, 5)), rid=i) for i in range(rng.randint(1, 9))]
    for req in running:
        sched.on_arrival(req, req.arrival)
    for client in sorted({r.client for r in running}) if hasattr(sched, "set_counter") else ():  # a ledger's
        sched.set_counter(client, float(rng.choice([0, 5, 10])))
    return running


@pytest.mark.parametrize(
    "make",
    [
        FCFS,
        VTC,
        lambda: build_scheduler("dlpm:100", ["a", "b", "c"]),
        lambda: RateLimited(VTC(), {"a": 100}),
        lambda: RouterGroup([VTC(), VTC()], ingress=lambda req: req.rid % 2, sync_s=None),
    ],
    ids=["fcfs", "vtc", "dlpm", "rate-limited", "router-group"],
)
@pytest.mark.parametrize("seed", range(20))
def test_the_victim_order_is_choose_victim_asked_again_and_again(make, seed):
    sched = make()
    running = _running_with_counters(sched, random.Random(seed))
    remaining, expected = list(running), []
    while remaining:
        expected.append(sched.choose_victim(remaining, 1.0))
        remaining.remove(expected[-1])
    assert sched.victim_order(running, 1.0) == expected
    assert victims_last(running, sched, 1.0) == expected[::-1]


def test_a_step_may_preempt_only_when_the_free_blocks_may_not_cover_it():
    # a budget of 2048 tokens in blocks of 32 asks for at most 64 blocks, plus 2 per running request
    assert not may_preempt(free_blocks=64 + 2 * 4 + 1, token_budget=2048, block_size=32, running=4)
    assert may_preempt(free_blocks=64 + 2 * 4, token_budget=2048, block_size=32, running=4)
    assert may_preempt(free_blocks=64 + 3 * 4, token_budget=2048, block_size=32, running=4, lookahead=1)


@pytest.mark.parametrize("seed", range(20))
def test_vtcs_victim_order_after_decode_steps_is_the_order_once_they_are_charged(seed):
    rng = random.Random(seed)
    vtc = VTC()
    running = _running_with_counters(vtc, rng)
    for req in running:  # admitted: each prompt charged, then its decode tokens one by one
        vtc.on_prefill(req, req.prompt_len, 0, 0.0)
    steps = rng.randint(1, 30)
    predicted = vtc.victim_order_after(running, steps, 0.0)
    for _ in range(steps):
        vtc.on_decode_step(running, 0.0)
        for req in running:
            req.generated += 1
    assert predicted == vtc.victim_order(running, 0.0)
