"""The scheduler interface: wrappers pass every call on, the traits drivers read, and a peek/pop
driver (vLLM's waiting-queue loop) admits and charges exactly as our engine's select."""

import inspect
from dataclasses import replace

import pytest

from slora_vtc.cluster.router_group import RouterGroup
from slora_vtc.cluster.shared import SharedView
from slora_vtc.request import Request
from slora_vtc.sched import DLPM, FCFS, LPM, RPM, VTC, Delegating, Ledger, LookAhead, RateLimited, Scheduler
from slora_vtc.sched.registry import build_scheduler
from tests.helpers.sched import FakeBudget

INTERFACES = (Scheduler, Ledger, LookAhead)


def public_methods(cls) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


EVERY_METHOD = set().union(*(public_methods(i) for i in INTERFACES))


class Spy(VTC):
    """A VTC that notes every call of the interface that reaches it."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __getattribute__(self, name):
        if name in EVERY_METHOD:
            object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)


def call_everything(sched, spies: list[Spy], methods: set[str] = EVERY_METHOD) -> dict[str, bool]:
    """Call each method of the interfaces once on `sched`, with arguments that make sense in turn;
    for each, whether a spy (a wrapped scheduler) heard of it."""
    a, b = Request("a", 4, 3, 0.0, rid=0), Request("a", 4, 3, 1.0, rid=1)
    calls = {
        "on_arrival": lambda: sched.on_arrival(a, 0.0) and sched.on_arrival(b, 1.0),
        "peek": lambda: sched.peek(FakeBudget()),
        "pop": lambda: sched.pop(sched.peek(FakeBudget()), 1.0),
        "on_prefill": lambda: sched.on_prefill(a, 4, 0, 1.0),
        "select": lambda: sched.select(FakeBudget(), 1.0),
        "on_decode_step": lambda: sched.on_decode_step([a], 1.0),
        "charge_steps": lambda: sched.charge_steps([a], 1, 1.0),
        "heads": lambda: sched.heads([a], 1, FakeBudget()),
        "queues_behind": lambda: sched.queues_behind(b),
        "choose_victim": lambda: sched.choose_victim([a, b], 1.0),
        "victim_order": lambda: sched.victim_order([a, b], 1.0),
        "victim_order_after": lambda: sched.victim_order_after([a, b], 2, 1.0),
        "on_preempt": lambda: sched.on_preempt(b, 1.0),
        "remove": lambda: sched.remove(b),
        "num_waiting": lambda: sched.num_waiting(),
        "waiting_by_client": lambda: sched.waiting_by_client(),
        "on_finish": lambda: sched.on_finish([a], [a], 2.0),
        "on_abort": lambda: (
            sched.on_arrival(c := Request("a", 4, 3, 2.0, rid=2), 2.0),
            sched.select(FakeBudget(), 2.0),
            sched.on_abort(c, 2.0),
        ),
        "drain": lambda: sched.drain(),
        "counter_of": lambda: sched.counter_of("a"),
        "counters": lambda: sched.counters(),
        "weight_of": lambda: sched.weight_of("a"),
        "set_weight": lambda: sched.set_weight("a", 2.0),
        "adjust": lambda: sched.adjust("a", 1.0),
        "set_counter": lambda: sched.set_counter("a", 5.0),
        "forget": lambda: sched.forget("a", 3.0),
    }
    assert set(calls) == EVERY_METHOD, "a method of the interface has no call here: add it"
    heard = {}
    for name, call in calls.items():
        if name not in methods:
            continue
        for spy in spies:
            spy.calls.clear()
        call()
        heard[name] = any(name in spy.calls or _reached_through(name, spy.calls) for spy in spies)
    return heard


def _reached_through(name: str, calls: list[str]) -> bool:
    """select is the loop of peek, pop and on_prefill: a wrapper may run that loop itself."""
    return name == "select" and {"peek", "pop", "on_prefill"} <= set(calls)


WRAPPERS = {
    "Delegating": lambda inner: Delegating(inner),
    "RateLimited": lambda inner: RateLimited(inner, {"a": 100}),
    "SharedView": lambda inner: SharedView(inner, 0, lambda req, i: None),
}
ANSWERS_ITSELF = {"SharedView": ["heads", "queues_behind"]}  # a replica's view cannot say (cluster/shared.py)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_every_method_of_the_core_and_the_capabilities_reaches_the_wrapped_scheduler(wrapper):
    spy = Spy()
    heard = call_everything(WRAPPERS[wrapper](spy), [spy])
    assert [name for name, ok in heard.items() if not ok] == ANSWERS_ITSELF.get(wrapper, [])


def test_every_method_reaches_a_router_of_a_router_group():
    spies = [Spy(), Spy()]
    group = RouterGroup(spies, ingress=lambda req: 0, sync_s=None)
    heard = call_everything(group, spies, public_methods(Scheduler) | public_methods(Ledger))
    # a router group never forgets (its totals need every client); it has no look-ahead, so it cannot
    # tell the order of its victims after decode steps it has not charged (its routers' counters merge it)
    assert [name for name, ok in heard.items() if not ok] == ["victim_order_after", "forget"]
    assert not group.traits.lookahead and not isinstance(group, LookAhead)


def test_a_wrapper_has_the_traits_of_what_it_wraps_and_a_shared_view_names_no_heads():
    assert RateLimited(VTC(), {}).traits == VTC.traits
    assert RateLimited(FCFS(), {}).traits == FCFS.traits
    assert SharedView(VTC(), 0, lambda req, i: None).traits == replace(VTC.traits, shared_queue=True)
    view, waiting, running = SharedView(VTC(), 0, lambda req, i: None), Request("a", 4, 3, 0.0, rid=0), []
    view.on_arrival(waiting, 0.0)
    assert view.inner.heads(running, 5, FakeBudget()) == [(0, waiting)]  # VTC alone names it
    assert view.heads(running, 5, FakeBudget()) is None
    assert not view.queues_behind(Request("a", 4, 3, 1.0, rid=1))  # VTC alone: behind a's waiting request
    assert view.inner.queues_behind(Request("a", 4, 3, 1.0, rid=1))


@pytest.mark.parametrize(
    "spec, traits",
    [
        ("fcfs", {"preemption", "lookahead"}),
        ("rpm:5", {"preemption", "lookahead"}),
        ("vtc", {"ledger", "weights", "preemption", "shareable", "lookahead"}),
        ("lcf", {"ledger", "weights", "preemption", "shareable", "lookahead"}),
        ("wvtc:1,2", {"ledger", "weights", "preemption", "shareable", "lookahead"}),
        ("vtc-avg", {"ledger", "weights", "preemption", "shareable", "lookahead"}),
        ("lpm", {"needs_token_ids", "preemption", "lookahead"}),
        ("dlpm:100", {"needs_token_ids", "ledger", "preemption", "lookahead"}),
    ],
)
def test_each_scheduler_declares_what_it_needs_and_offers(spec, traits):
    declared = build_scheduler(spec, ["a", "b"]).traits
    assert {name for name, on in vars(declared).items() if on} == traits


def test_the_built_in_classes_are_what_the_registry_builds():
    assert isinstance(build_scheduler("rpm:5", ["a"]), RPM)
    assert isinstance(build_scheduler("lpm:3", ["a"]), LPM)
    assert isinstance(build_scheduler("dlpm:3", ["a"]), DLPM)
