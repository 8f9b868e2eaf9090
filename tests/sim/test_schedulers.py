"""Each scheduler on small cases worked out by hand (docs/design.md, "Schedulers")."""

import pytest

from slora_vtc.cost import LinearCost, ProfiledCost
from slora_vtc.errors import UserError
from slora_vtc.memory import Budget
from slora_vtc.request import State
from slora_vtc.sched import FCFS, RPM, VTC, Lift, SchedulerOptions, build_scheduler
from slora_vtc.sched.vtc_predict import (
    LengthPredictor,
    MovingAveragePredictor,
    OraclePredictor,
    PredictingVTC,
    UniformErrorPredictor,
)
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.engine import config, make_engine, req
from tests.helpers.sched import arrive

BIG = config(100_000)


def select(sched, running=(), cfg=BIG):
    return sched.select(Budget(cfg, list(running)), 0.0)


def prefill(*reqs):
    """What the engine's prefill does to a request: its first output token."""
    for r in reqs:
        r.state = State.RUNNING
        r.append_token(None, 0.0)


def decode(sched, running):
    """One decode step as the engine runs it: charge, then one token each."""
    sched.on_decode_step(running, 0.0)
    for r in running:
        r.append_token(None, 0.0)


def blocker():
    """A running request holding (51, 99) of a 200-token pool: a (81, 39) candidate needs 210."""
    r = req("x", 50, 100)
    prefill(r)
    return r


# -- FCFS and RPM ----------------------------------------------------------------------------
def test_fcfs_serves_in_arrival_order():
    fcfs = FCFS()
    reqs = [req("b", 10, 5), req("a", 10, 5), req("b", 3, 5)]
    arrive(fcfs, *reqs)
    assert select(fcfs) == reqs
    assert fcfs.num_waiting() == 0


def test_fcfs_head_of_line_blocks_smaller_requests():
    fcfs = FCFS()
    big, small = req("a", 80, 40), req("b", 5, 5)
    arrive(fcfs, big, small)
    assert select(fcfs, [blocker()], config(200)) == []
    assert fcfs.num_waiting() == 2
    fcfs2 = FCFS()
    arrive(fcfs2, small, big)
    assert select(fcfs2, [blocker()], config(200)) == [small]


def test_rpm_counts_only_accepted_arrivals_in_the_last_minute():
    rpm = RPM(limit=2)
    times = [0.0, 1.0, 2.0, 3.0, 60.5, 61.5, 61.6]
    verdicts = [rpm.on_arrival(req("a", 1, 1, t), t) for t in times]
    # 60.5: accepted ones in (0.5, 60.5] are only t=1 (rejected 2, 3 do not count) -> accept
    # 61.5: accepted in (1.5, 61.5]: 60.5 -> accept; 61.6: 60.5, 61.5 -> reject
    assert verdicts == [True, True, False, False, True, True, False]
    assert rpm.on_arrival(req("b", 1, 1, 61.6), 61.6)  # per client
    assert rpm.num_waiting() == 5


def test_rpm_window_is_sixty_seconds_to_the_boundary():
    """Accepted at 0; one limit: refused until the arrival at 0 is 60 s old, then accepted."""
    rpm = RPM(limit=1)
    times = [0.0, 50.0, 59.999, 60.0, 119.999, 120.0]
    assert [rpm.on_arrival(req("a", 1, 1, t), t) for t in times] == [True, False, False, True, False, True]


def test_rpm_rejected_requests_are_never_served():
    reqs = [req("a", 10, 3, t) for t in (0.0, 0.1, 0.2, 0.3)] + [req("b", 10, 3, 0.4)]
    engine = make_engine(RPM(limit=2))
    engine.run(reqs)
    assert [r.state for r in reqs] == [State.FINISHED] * 2 + [State.REJECTED] * 2 + [State.FINISHED]
    for r in reqs[2:4]:
        assert r.generated == 0 and r.first_token_time is None
    served = {rid for _, rids, _ in engine.backend.calls for rid in rids}
    assert served == {reqs[0].rid, reqs[1].rid, reqs[4].rid}


# -- VTC counters ----------------------------------------------------------------------------
def test_vtc_charges_prompt_at_admission_and_two_per_decode_step():
    vtc = VTC()
    a1, a2, b1 = req("a", 10, 4), req("a", 7, 3), req("b", 5, 3)
    arrive(vtc, a1, a2, b1)
    assert select(vtc) == [a1, b1, a2]  # a (0) -> a=10; b (0) -> b=5; b empty, a (10) -> a=17
    assert (vtc.counter_of("a"), vtc.counter_of("b")) == (17, 5)
    prefill(a1, a2, b1)
    decode(vtc, [a1, a2, b1])
    assert (vtc.counter_of("a"), vtc.counter_of("b")) == (21, 7)
    decode(vtc, [a1, a2, b1])
    assert (vtc.counter_of("a"), vtc.counter_of("b")) == (25, 9)


def test_vtc_final_counter_over_an_engine_run():
    # plain VTC: prompt at admission, 2 before each of the output_len - 1 decode steps
    vtc = VTC()
    reqs = [req("a", 10, 5), req("a", 20, 1), req("b", 30, 8, 3.0)]
    make_engine(vtc).run(reqs)
    assert vtc.counter_of("a") == 10 + 20 + 2 * 4
    # b arrives (t=3) after a's queue emptied: the PAPER lift raises it to a's 38 first
    assert vtc.counter_of("b") == 38 + 30 + 2 * 7


def test_vtc_picks_the_smallest_counter():
    vtc = VTC()
    a = [req("a", 50, 2) for _ in range(3)]
    b = [req("b", 20, 2) for _ in range(3)]
    arrive(vtc, *a, *b)
    # a0 (a=50), b0 (b=20), b1 (b=40), b2 (b=60; b empty), a1 (a=100), a2 (a=150)
    assert select(vtc) == [a[0], b[0], b[1], b[2], a[1], a[2]]


def test_vtc_head_of_line_stops_at_the_min_counter_client():
    vtc = VTC()
    big, small = req("a", 80, 40), req("b", 5, 5)
    arrive(vtc, big)  # a registered first: ties go to a
    arrive(vtc, small)
    assert select(vtc, [blocker()], config(200)) == []  # b's small request would fit
    assert vtc.num_waiting() == 2
    assert (vtc.counter_of("a"), vtc.counter_of("b")) == (0, 0)


def test_vtc_ties_go_to_the_client_registered_first():
    vtc = VTC(lift=Lift.ARTIFACT)
    z1, a1 = req("z", 10, 1), req("a", 10, 1)
    arrive(vtc, z1)
    assert select(vtc) == [z1]  # z = 10
    arrive(vtc, a1)  # no other client waits: ARTIFACT does not lift, a = 0
    assert select(vtc) == [a1]  # a = 10
    a2, z2 = req("a", 1, 1), req("z", 1, 1)
    arrive(vtc, a2)  # a arrives first ...
    arrive(vtc, z2)  # ... z lifted to max(10, a=10): a tie, and z registered first
    assert select(vtc) == [z2, a2]


@pytest.mark.parametrize("lift", [Lift.PAPER, Lift.ARTIFACT])
def test_lift_to_the_min_counter_of_other_waiting_clients(lift):
    vtc = VTC(lift=lift)
    arrive(vtc, req("a", 30, 1), req("a", 1, 1), req("c", 50, 1), req("c", 1, 1))
    assert len(select(vtc, cfg=config(100_000, max_running=2))) == 2
    assert (vtc.counter_of("a"), vtc.counter_of("c")) == (30, 50)  # both still wait
    arrive(vtc, req("b", 1, 1))
    assert vtc.counter_of("b") == 30


def test_lift_never_lowers_a_counter():
    vtc = VTC(lift=Lift.ARTIFACT)
    arrive(vtc, req("b", 200, 1))
    select(vtc)  # b = 200, then b's queue is empty
    arrive(vtc, req("a", 10, 1), req("a", 1, 1))  # nobody waits: a stays 0
    select(vtc, cfg=config(100_000, max_running=1))  # a = 10, a still waits
    arrive(vtc, req("b", 1, 1))
    assert vtc.counter_of("b") == 200


@pytest.mark.parametrize("lift, c, b", [(Lift.PAPER, 65, 65), (Lift.ARTIFACT, 40, 0), (Lift.NONE, 40, 0)])
def test_lift_when_no_client_waits(lift, c, b):
    vtc = VTC(lift=lift)
    arrive(vtc, req("a", 25, 1))
    select(vtc)  # a = 25 and leaves the queue
    arrive(vtc, req("c", 40, 1))  # PAPER: lifted to the last client to leave (a, 25)
    select(vtc)  # c charged 40; c is now the last to leave
    arrive(vtc, req("b", 1, 1))  # nobody waits
    assert (vtc.counter_of("c"), vtc.counter_of("b")) == (c, b)


@pytest.mark.parametrize(
    "lift, a1_ended, lifted_to",
    [
        (Lift.PAPER, False, 510),  # the paper: the least waiting counter, b's
        (Lift.RUNNING, False, 510 - (10 + 2 * 20)),  # a still runs a1: it keeps the worst case of a2, h(10, 20)
        (Lift.RUNNING, True, 510),  # nothing of a runs: lifted as the paper does
    ],
)
def test_the_running_lift_leaves_a_client_being_served_one_requests_credit(lift, a1_ended, lifted_to):
    vtc = VTC(lift=lift)
    a1 = req("a", 10, 100, rid=1)
    arrive(vtc, a1)
    assert select(vtc) == [a1]  # a = 10, a runs a1 and waits for nothing
    b1, b2 = req("b", 500, 1, rid=2), req("b", 1, 1, rid=3)
    arrive(vtc, b1, b2)  # b lifted to a's 10 (a left the queue last)
    assert select(vtc, [a1], config(100_000, max_running=2)) == [b1]  # b = 10 + 500, b2 waits
    if a1_ended:
        vtc.on_finish([a1], [a1], 0.0)
    arrive(vtc, req("a", 10, 20, rid=4))
    assert vtc.counter_of("a") == lifted_to


@pytest.mark.parametrize("spec", ["lcf", "vtc"])
def test_lcf_idle_client_keeps_its_low_counter_and_monopolises(spec):
    sched = build_scheduler(spec, ["a", "b"])
    arrive(sched, *[req("a", 100, 1) for _ in range(5)])
    select(sched)  # a = 500, a's queue empties
    a_next = req("a", 100, 1)
    late = [req("b", 100, 1) for _ in range(6)]
    arrive(sched, a_next, *late)
    order = select(sched)
    if spec == "lcf":
        # b keeps 0: chosen five times (0 .. 400) before a (500) gets a turn; the tie at 500 goes to a
        assert order == late[:5] + [a_next, late[5]]
    else:
        # VTC lifts b to a's 500 on arrival; the tie goes to a, then b
        assert order == [a_next] + late


def test_weighted_vtc_divides_charges_by_weight():
    wvtc = build_scheduler("wvtc:1,2", ["a", "b"])
    a1, b1 = req("a", 10, 3), req("b", 10, 3)
    arrive(wvtc, a1, b1)
    select(wvtc)
    assert (wvtc.counter_of("a"), wvtc.counter_of("b")) == (10, 5)
    prefill(a1, b1)
    decode(wvtc, [a1, b1])
    assert (wvtc.counter_of("a"), wvtc.counter_of("b")) == (12, 6)


def test_weighted_vtc_serves_in_proportion_to_weight():
    wvtc = build_scheduler("wvtc:1,3", ["a", "b"])
    a = [req("a", 10, 1) for _ in range(8)]
    b = [req("b", 10, 1) for _ in range(8)]
    arrive(wvtc, *a, *b)
    first = select(wvtc, cfg=config(100_000, max_running=8))
    assert sum(r.client == "b" for r in first) == 6 and sum(r.client == "a" for r in first) == 2


# -- cost functions and the artifact's extra charge ------------------------------------------
def test_profiled_cost_charges_increments():
    h = ProfiledCost()
    vtc = VTC(cost=h)
    r = req("a", 100, 3)
    arrive(vtc, r)
    select(vtc)
    assert vtc.counter_of("a") == pytest.approx(h(100, 0))
    prefill(r)
    decode(vtc, [r])  # the step making token 2
    assert vtc.counter_of("a") == pytest.approx(h(100, 0) + h(100, 2) - h(100, 1))
    decode(vtc, [r])
    assert vtc.counter_of("a") == pytest.approx(h(100, 0) + h(100, 3) - h(100, 1))


def test_extra_charge_at_finish_adds_one_decode_charge_for_the_batch():
    for extra in (False, True):
        vtc = VTC(extra_charge_at_finish=extra)
        a1, b1 = req("a", 10, 2), req("b", 10, 5)
        arrive(vtc, a1, b1)
        select(vtc)
        prefill(a1, b1)
        decode(vtc, [a1, b1])  # a1 has its 2 tokens now
        assert (vtc.counter_of("a"), vtc.counter_of("b")) == (12, 12)
        vtc.on_finish([a1], [a1, b1], 0.0)
        assert (vtc.counter_of("a"), vtc.counter_of("b")) == ((14, 14) if extra else (12, 12))


def test_extra_charge_at_finish_in_an_engine_run():
    counters = []
    for extra in (False, True):
        vtc = VTC(extra_charge_at_finish=extra)
        make_engine(vtc).run([req("a", 10, 5)])
        counters.append(vtc.counter_of("a"))
    assert counters == [10 + 2 * 4, 10 + 2 * 5]


# -- length prediction -----------------------------------------------------------------------
class Fixed(LengthPredictor):
    def __init__(self, value):
        self.value = value

    def predict(self, req):
        return self.value


def serve(vtc, r):
    """Admit, prefill and decode one request to the end, as the engine would."""
    arrive(vtc, r)
    assert select(vtc) == [r]
    prefill(r)
    while not r.done:
        decode(vtc, [r])
    vtc.on_finish([r], [r], 0.0)


def test_oracle_charges_everything_up_front():
    vtc = PredictingVTC(OraclePredictor())
    r = req("a", 10, 6)
    arrive(vtc, r)
    select(vtc)
    assert vtc.counter_of("a") == 10 + 2 * 6
    prefill(r)
    while not r.done:
        decode(vtc, [r])
        assert vtc.counter_of("a") == 22
    vtc.on_finish([r], [r], 0.0)
    assert vtc.counter_of("a") == 22


@pytest.mark.parametrize("predicted", [0.0, 2.0, 2.5, 5.0, 10.0, 40.0])
def test_final_counter_is_the_cost_of_actual_service(predicted):
    vtc = PredictingVTC(Fixed(predicted))
    serve(vtc, req("a", 10, 5))
    # up to the prediction charged at admission; beyond it per token; an overshoot refunded
    expected = 10 + 2 * 5 if predicted >= 1 else 10 + 2 * 4  # plain VTC never charges token 1
    assert vtc.counter_of("a") == pytest.approx(expected)


def test_overshoot_is_refunded_only_at_finish():
    vtc = PredictingVTC(Fixed(10))
    r = req("a", 10, 4)
    arrive(vtc, r)
    select(vtc)
    prefill(r)
    while not r.done:
        decode(vtc, [r])
    assert vtc.counter_of("a") == 30  # 10 + 2 * 10, nothing during decode
    vtc.on_finish([r], [r], 0.0)
    assert vtc.counter_of("a") == 18


def test_an_aborted_running_request_is_settled_like_a_finished_one():
    engine = make_engine(PredictingVTC(Fixed(10)), pool_tokens=1000)
    r = req("a", 10, 8)
    engine.add_request(r)
    engine.step()  # prefill: 10 + 2 * 10 charged, one token out
    engine.step()  # one decode step, within the prediction
    engine.abort(r)
    assert r.state is State.ABORTED and r.generated == 2
    assert engine.scheduler.counter_of("a") == 10 + 2 * 2  # refunded down to the 2 tokens it got
    assert engine.scheduler.records == {}


def test_uniform_predictor_stays_in_range_and_is_seeded():
    r = req("a", 10, 100)
    p1, p2, p3 = (
        UniformErrorPredictor(0.5, seed=7),
        UniformErrorPredictor(0.5, seed=7),
        UniformErrorPredictor(0.5, seed=8),
    )
    s1 = [p1.predict(r) for _ in range(200)]
    assert all(50 <= p <= 150 for p in s1)
    assert min(s1) < 60 and max(s1) > 140  # spreads over the range
    assert s1 == [p2.predict(r) for _ in range(200)]
    assert s1 != [p3.predict(r) for _ in range(200)]


def test_registry_seeds_the_uniform_predictor():
    def counters(seed):
        vtc = build_scheduler("vtc-pred:0.5", ["a"], SchedulerOptions(seed=seed))
        arrive(vtc, *[req("a", 10, 100) for _ in range(3)])
        select(vtc)
        return vtc.counter_of("a")

    assert counters(1) == counters(1) != counters(2)
    assert 30 + 3 * 100 <= counters(1) <= 30 + 3 * 300


def test_moving_average_predictor():
    m = MovingAveragePredictor()
    a = req("a", 1, 100)
    assert m.predict(a) == 0.0  # nothing seen yet
    for out in (100, 50, 150):
        done = req("a", 1, out)
        done.generated = out
        m.observe(done)
    # 100, then (4 * 100 + 50) / 5 = 90, then (4 * 90 + 150) / 5 = 102
    assert m.predict(a) == pytest.approx(102)
    assert m.predict(req("b", 1, 7)) == 0.0  # per client


def test_vtc_avg_learns_from_finished_requests():
    vtc = build_scheduler("vtc-avg", ["a"])
    serve(vtc, req("a", 10, 20))  # predicted 0: plain VTC, 10 + 2 * 19
    assert vtc.counter_of("a") == 48
    r = req("a", 10, 5)
    arrive(vtc, r)
    select(vtc)
    assert vtc.counter_of("a") == 48 + 10 + 2 * 20  # predicted 20, the first actual
    prefill(r)
    while not r.done:
        decode(vtc, [r])
    vtc.on_finish([r], [r], 0.0)
    assert vtc.counter_of("a") == 48 + 10 + 2 * 5  # refunded down to the actual 5


# -- registry --------------------------------------------------------------------------------
def test_build_scheduler_by_name():
    assert type(build_scheduler("fcfs", [])) is FCFS
    rpm = build_scheduler("rpm:15", [])
    assert isinstance(rpm, RPM) and rpm.limit == 15
    assert build_scheduler("lcf", []).lift is Lift.NONE
    assert build_scheduler("vtc", []).lift is Lift.PAPER
    assert build_scheduler("vtc", [], SchedulerOptions(lift=Lift.ARTIFACT)).lift is Lift.ARTIFACT
    assert build_scheduler("wvtc:1,2.5", ["x", "y"]).weights == {"x": 1.0, "y": 2.5}
    assert isinstance(build_scheduler("vtc-oracle", []).predictor, OraclePredictor)
    assert isinstance(build_scheduler("vtc", [], SchedulerOptions(cost=ProfiledCost())).cost, ProfiledCost)
    assert build_scheduler("vtc", [], SchedulerOptions(extra_charge_at_finish=True)).extra_charge_at_finish
    assert isinstance(build_scheduler("vtc", []).cost, LinearCost)


@pytest.mark.parametrize(
    "spec, clients, message",
    [
        ("rpm:abc", [], "'abc' is not an integer"),
        ("rpm:0", [], "must be positive"),
        ("rpm:-3", [], "must be positive"),
        ("rpm", [], "needs an argument"),
        ("wvtc:1,0", ["a", "b"], "weights must be positive"),
        ("wvtc:-1,2", ["a", "b"], "weights must be positive"),
        ("wvtc:1,x", ["a", "b"], "weights must be numbers"),
        ("wvtc:inf,1", ["a", "b"], r"^scheduler 'wvtc:inf,1': weights must be positive and finite, got inf,1$"),
        ("wvtc:1,-inf", ["a", "b"], r"weights must be positive and finite, got 1,-inf$"),
        ("wvtc:nan,1", ["a", "b"], r"weights must be positive and finite, got nan,1$"),
        ("wvtc:1,1e999", ["a", "b"], r"weights must be positive and finite, got 1,1e999$"),
        ("wvtc:1,2,3", ["a", "b"], "3 weights for 2 clients"),
        ("wvtc:1", ["a", "b"], "1 weights for 2 clients"),
        ("vtc-pred:1.5", [], "error ratio"),
        ("vtc:3", [], "takes no argument"),
        ("nope", [], "unknown scheduler 'nope'"),
    ],
)
def test_bad_specs_raise_user_error(spec, clients, message):
    with pytest.raises(UserError, match=message):
        build_scheduler(spec, clients)


@pytest.mark.parametrize("weights", ["inf,1", "nan,1"])
def test_a_non_finite_weight_is_one_line_from_the_cli(capsys, weights):
    code, out, err = run_cli(capsys, "run", "--suite", "overload", "--scheduler", f"wvtc:{weights}", "--duration", "5")
    assert_one_line_error(code, err)
    assert err == f"slora-vtc: error: scheduler 'wvtc:{weights}': weights must be positive and finite, got {weights}\n"
    assert out == ""
