"""Forgetting idle clients (Scheduler.forget): a scheduler that forgets behaves exactly as one that
never does, under the same random arrivals, admissions, decode steps, preemptions, idles and returns."""

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from slora_vtc.request import Request, State
from slora_vtc.sched import VTC, Lift
from slora_vtc.sched.dlpm import DLPM
from slora_vtc.sched.fcfs import FCFS
from slora_vtc.sched.limits import RateLimited
from slora_vtc.sched.vtc_predict import PredictingVTC, UniformErrorPredictor
from tests.helpers.sched import FakeBudget

CLIENTS = ["a", "b", "c", "d"]


@dataclass
class World:
    """One scheduler and the requests it serves, driven step by step as the engine would."""

    sched: object
    running: list[Request] = field(default_factory=list)
    waiting: dict[str, int] = field(default_factory=dict)  # per client, queued in the scheduler
    arrived: list[Request] = field(default_factory=list)
    now: float = 0.0

    def arrive(self, rid: int, client: str, prompt: int, output: int) -> bool:
        req = Request(client, prompt, output, self.now, rid=rid)
        accepted = self.sched.on_arrival(req, self.now)
        if accepted:
            self.waiting[client] = self.waiting.get(client, 0) + 1
            self.arrived.append(req)
        return accepted

    def select(self, room: int) -> list[int]:
        chosen = self.sched.select(FakeBudget(room=room), self.now)
        for req in chosen:
            req.state = State.RUNNING
            req.append_token(None, self.now)
            self.waiting[req.client] -= 1
        self.running += chosen
        self._retire(chosen)
        return [r.rid for r in chosen]

    def decode(self) -> None:
        if self.running:
            self.sched.on_decode_step(self.running, self.now)
            for req in self.running:
                req.append_token(None, self.now)
            self._retire(self.running)

    def preempt(self) -> None:
        if self.running and self.sched.traits.preemption:
            victim = self.sched.choose_victim(self.running, self.now)
            self.running.remove(victim)
            victim.state = State.WAITING
            self.sched.on_preempt(victim, self.now)
            self.waiting[victim.client] += 1

    def abort(self, k: int) -> None:
        """End the k-th (mod how many) request in the scheduler, waiting or running, by rid."""
        live = sorted([*self.queued(), *self.running], key=lambda r: r.rid)
        if not live:
            return
        req = live[k % len(live)]
        req.state = State.ABORTED
        if req in self.running:
            self.running.remove(req)
            self.sched.on_abort(req, self.now)
        else:
            assert self.sched.remove(req)
            self.waiting[req.client] -= 1

    def queued(self) -> list[Request]:
        return [r for r in self.arrived if r.state is State.WAITING and r not in self.running]

    def idle(self, client: str) -> bool:
        return not self.waiting.get(client) and not any(r.client == client for r in self.running)

    def _retire(self, batch: list[Request]) -> None:
        done = [r for r in batch if r.done]
        for req in done:
            req.state = State.FINISHED
        if done:
            self.sched.on_finish(done, batch, self.now)
            self.running = [r for r in self.running if not r.done]


OPS = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(CLIENTS), st.integers(1, 6), st.integers(1, 3)),
    st.tuples(st.just("select"), st.integers(0, 14)),
    st.tuples(st.just("decode")),
    st.tuples(st.just("preempt")),
    st.tuples(st.just("abort"), st.integers(0, 20)),
    st.tuples(st.just("forget")),  # every idle client, as the server's expiry does
    st.tuples(st.just("wait"), st.integers(1, 40)),
)


def replay(make, ops, state_of) -> int:
    """Drive a forgetting and a never-forgetting copy; every decision and the state that shows
    must agree after every operation. Returns (forget calls, those that answered True)."""
    kept, forgetful = World(make()), World(make())
    forgotten = dropped = 0
    for rid, op in enumerate(ops):
        if op[0] == "arrive":
            assert kept.arrive(rid, *op[1:]) == forgetful.arrive(rid, *op[1:])
        elif op[0] == "select":
            assert kept.select(op[1]) == forgetful.select(op[1])
        elif op[0] == "decode":
            kept.decode()
            forgetful.decode()
        elif op[0] == "preempt":
            kept.preempt()
            forgetful.preempt()
        elif op[0] == "abort":
            kept.abort(op[1])
            forgetful.abort(op[1])
        elif op[0] == "wait":
            kept.now += op[1]
            forgetful.now += op[1]
        else:
            for client in filter(forgetful.idle, CLIENTS):
                forgotten += 1
                dropped += forgetful.sched.forget(client, forgetful.now)
        assert [r.rid for r in kept.running] == [r.rid for r in forgetful.running]
        assert kept.sched.waiting_by_client() == forgetful.sched.waiting_by_client()
        shown = state_of(forgetful.sched)
        assert shown == {name: state_of(kept.sched)[name] for name in shown}
    return forgotten, dropped


def vtc_counters(sched) -> dict[str, float]:
    return sched.counters()


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, min_size=10, max_size=80), st.sampled_from(list(Lift)), st.booleans(), st.booleans())
def test_a_forgetting_vtc_decides_as_one_that_never_forgets(ops, lift, predict, quirks):
    def make():
        settings = dict(lift=lift, extra_charge_at_finish=quirks, charge_recompute=quirks)
        return PredictingVTC(UniformErrorPredictor(0.5, seed=3), **settings) if predict else VTC(**settings)

    replay(make, ops, vtc_counters)


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, min_size=10, max_size=80))
def test_a_forgetting_dlpm_decides_as_one_that_never_forgets(ops):
    replay(lambda: DLPM(quantum=5.0), ops, lambda s: s.deficits())


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, min_size=10, max_size=80))
def test_a_forgetting_rate_limiter_accepts_as_one_that_never_forgets(ops):
    replay(lambda: RateLimited(VTC(), {"a": 1}, default=2), ops, vtc_counters)


# -- what is kept, worked by hand ----------------------------------------------------------------------
def serve_one(sched: VTC, client: str, rid: int, prompt: int, now: float) -> Request:
    """One request of `client` arrives, is admitted (charged h(prompt, 0) = prompt) and finishes."""
    world = World(sched, now=now)
    world.arrive(rid, client, prompt, 1)
    assert world.select(100) == [rid]
    return world.running[0] if world.running else None


def test_a_served_idle_client_at_the_floor_leaves_only_its_order_behind():
    vtc = VTC()
    serve_one(vtc, "a", 0, 5, 0.0)  # a: 5
    serve_one(vtc, "b", 1, 3, 1.0)  # b lifted to 5 (a left last, nobody waits), then 5 + 3 = 8; b left last
    assert vtc.counters() == {"a": 5.0, "b": 8.0}
    assert vtc.forget("a", 2.0)  # 5 <= B = min(floor 8, b's 8): the lift gives it back
    assert vtc.counters() == {"b": 8.0} and vtc.idle.kept == {} and vtc.idle.orders == {"a": 0}
    assert vtc.forget("b", 2.0)  # 8 <= B = 8: its own counter stays as the floor of the next return
    assert vtc.counters() == {} and vtc.idle.kept == {}
    serve_one(vtc, "a", 2, 1, 3.0)
    assert vtc.counters() == {"a": 8.0 + 1.0}  # lifted to 8, as a never-forgetting VTC does (max(5, 8)), then + 1


def test_the_last_to_leave_the_queue_comes_back_as_the_floor():
    """Found by the property above: a forgotten client that was the last to leave the queue returns,
    is lifted, and leaves again by removal (not admission): it is still the last to leave, so the
    next arrival into an empty queue is lifted to its counter now, not to the one it was forgotten with."""
    vtc = VTC()
    world = World(vtc)
    world.arrive(0, "b", 1, 1)
    world.arrive(1, "c", 4, 1)
    world.arrive(2, "c", 1, 1)
    assert world.select(5) == [0, 1]  # b: 1, then c: 4; b's queue emptied by admission, c's second waits
    assert vtc.forget("b", 0.0)  # 1 <= B = min(floor 4, the last to leave's 1)
    world.arrive(3, "b", 1, 1)  # b returns, lifted to c's 4
    world.abort(0)  # c's waiting request leaves, then b's: removed, not admitted, so b left the queue last
    world.abort(0)
    world.arrive(4, "a", 1, 1)  # nobody waits: lifted to b's 4
    assert vtc.counters() == {"b": 4.0, "c": 4.0, "a": 4.0}


def test_a_returner_keeps_its_registration_order_for_the_tie_its_lift_makes():
    vtc = VTC()
    serve_one(vtc, "a", 0, 2, 0.0)  # a registered first: order 0, counter 2
    world = World(vtc, now=1.0)
    world.arrive(1, "b", 9, 1)  # b lifted to 2 (a left last), waits
    assert vtc.forget("a", 1.0)  # 2 <= B = 2
    world.arrive(2, "a", 1, 1)  # a returns: lifted to b's 2, a tie that the earlier registration wins
    assert world.select(100) == [2, 1]


def test_no_counter_is_dropped_before_a_client_has_left_the_queue():
    vtc = VTC()
    world = World(vtc)
    world.arrive(0, "a", 3, 1)
    world.arrive(1, "a", 3, 1)
    assert world.select(3) == [0]  # a: 3, its second request still waits: nobody has left the queue
    world.arrive(2, "b", 9, 1)  # b lifted to a's 3
    world.abort(0)  # a's second request leaves by removal: a is idle, and still no client ever left the queue
    assert vtc.forget("a", 0.0) is False and vtc.idle.kept == {"a": 3.0}  # the floor is b's 3 now, but none once b goes
    world.abort(0)  # b removed too: nobody waits and nobody left, so a return is not lifted at all
    world.arrive(3, "a", 1, 1)
    assert vtc.counter_of("a") == 3.0  # as a never-forgetting VTC: its own 3, not 0


def test_lcf_keeps_an_idle_clients_low_counter():
    vtc = VTC(lift=Lift.NONE)
    serve_one(vtc, "a", 0, 4, 0.0)
    assert vtc.forget("a", 1.0)  # nothing more can be dropped later ...
    assert vtc.idle.kept == {"a": 4.0}  # ... because LCF would serve it from 4, not from 0
    serve_one(vtc, "a", 1, 1, 2.0)
    assert vtc.counters() == {"a": 5.0}


def test_forget_refuses_a_client_with_work():
    vtc, fcfs = VTC(), FCFS()
    world = World(vtc)
    world.arrive(0, "a", 2, 3)
    assert not vtc.forget("a", 0.0)  # waiting
    world.select(100)
    assert not vtc.forget("a", 0.0)  # running
    assert vtc.counters() == {"a": 2.0}
    assert not fcfs.traits.ledger and not hasattr(fcfs, "forget")  # no per-client state: nothing to forget


def test_a_rate_limit_window_is_dropped_once_it_counts_nothing():
    limited = RateLimited(FCFS(), {}, default=1)
    assert limited.on_arrival(Request("a", 1, 1, 0.0, rid=0), 0.0)
    limited.drain()  # nothing waits: a is idle
    assert limited.on_arrival(Request("b", 1, 1, 59.0, rid=1), 59.0)
    assert "a" in limited._accepted  # its arrival at 0 still counts until 60 ...
    assert not limited.on_arrival(Request("a", 1, 1, 59.0, rid=2), 59.0)
    assert limited.on_arrival(Request("c", 1, 1, 60.0, rid=3), 60.0)
    assert "a" not in limited._accepted and "b" in limited._accepted  # ... and no longer at 60


def test_only_the_latest_forgotten_orders_are_kept(monkeypatch):
    import slora_vtc.sched.vtc_forget as vtc_forget

    monkeypatch.setattr(vtc_forget, "KEPT_ORDERS", 2)
    vtc = VTC()
    for rid, name in enumerate("abc"):
        serve_one(vtc, name, rid, 1, float(rid))  # orders 0, 1, 2; each left the queue at counter 1
    for name in "abc":
        assert vtc.forget(name, 5.0)
    assert dict(vtc.idle.orders) == {"b": 1, "c": 2}  # a's order went first
    world = World(vtc, now=6.0)
    world.arrive(10, "a", 1, 1)
    assert vtc.clients["a"].order == 3  # a returns as a new client


def test_adjust_raises_and_refunds_a_counter_and_keeps_selection_by_it():
    vtc = VTC(weights={"b": 2.0})
    world = World(vtc)
    world.arrive(0, "a", 4, 1)
    world.arrive(1, "b", 4, 1)
    vtc.adjust("a", 10.0)  # a: 10, b: 0
    vtc.adjust("b", 12.0)  # b: 12 (counter units, whatever its weight)
    assert vtc.counters() == {"a": 10.0, "b": 12.0}
    vtc.adjust("b", -5.0)  # a refund: b at 7 now comes first
    assert world.select(100)[0] == 1
