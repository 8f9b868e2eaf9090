"""Macro-steps (slora_vtc/macro_step.py): the simulator's decode steps between two events run as
one, and every result file is byte for byte what single steps write.

The pieces are checked against single steps too: the backend's timing of k steps, the slots of k
steps, the budget's first fit after k steps, VTC's first waiting client after k charges.
"""

import copy
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slora_vtc.backends.sim import TESTBEDS, SimBackend
from slora_vtc.clock import VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.engine import Engine
from slora_vtc.experiment import Experiment
from slora_vtc.macro_step import first_fit
from slora_vtc.memory import Budget, MemoryManager, TokenPool
from slora_vtc.request import Request, State
from slora_vtc.results import RunResult
from slora_vtc.runner import run_experiment
from slora_vtc.sched import build_scheduler
from tests.helpers.engine import make_engine, outcomes
from tests.helpers.sched import FakeBudget
from tests.helpers.workloads import arrivals

# (suite, scheduler, other settings): every scheduler family, both costs, both admissions, the
# prefix cache with its schedulers, and the real trace
CASES = [
    ("overload", "vtc", {}),
    ("overload", "fcfs", {}),
    ("overload", "lcf", {}),
    ("overload", "rpm:20", {}),
    ("overload", "vtc-pred:0.5", {}),
    ("overload", "vtc-oracle", {}),
    ("overload", "vtc-avg", {}),
    ("overload_weighted", "wvtc:1,2,3,4", {}),
    ("overload", "vtc", {"cost": "profile"}),
    ("overload", "vtc", {"admission": "optimistic"}),
    ("dist_shift", "lcf", {}),
    ("poisson_short_long_2", "vtc", {}),
    ("real", "vtc", {}),
    ("prefix_qa", "lpm", {"prefix_cache": True}),
    ("prefix_chat", "dlpm:8000", {"prefix_cache": True}),
    ("prefix_tot", "dlpm:2000", {"prefix_cache": True, "admission": "optimistic"}),
    ("prefix_judge", "vtc", {"prefix_cache": True, "admission": "optimistic", "charge_cached": 0.0}),
]


def run(exp: Experiment, macro_steps: bool) -> RunResult:
    """run_experiment, with macro-steps on or off."""
    return run_experiment(exp, macro_steps=macro_steps)


@pytest.mark.parametrize("suite,scheduler,settings", CASES, ids=[f"{s}-{p}-{'-'.join(o)}" for s, p, o in CASES])
@pytest.mark.slow
def test_the_result_file_is_that_of_single_steps(suite, scheduler, settings):
    exp = Experiment.of(
        suite=suite,
        scheduler=scheduler,
        duration=60 if suite.startswith(("overload", "poisson", "dist", "real")) else None,
        **settings,
    )
    macro, single = run(exp, True), run(exp, False)
    assert macro.to_json() == single.to_json()
    assert {r.status for r in macro.responses} <= {"finished", "rejected"}


@settings(max_examples=250, deadline=None)
@given(
    requests=arrivals(),
    spec=st.sampled_from(
        ["fcfs", "vtc", "lcf", "rpm:30", "wvtc:1,2,1,3", "dlpm:600", "vtc-pred:0.5", "vtc-avg", "vtc-oracle"]
    ),
    prefix_cache=st.booleans(),
    optimistic=st.booleans(),
    pool=st.integers(320, 4000),
    max_wait_steps=st.sampled_from([1, 3, 10]),
)
def test_macro_steps_end_every_request_as_single_steps_do(
    requests, spec, prefix_cache, optimistic, pool, max_wait_steps
):  # fmt: skip
    """On random small workloads (arrivals, shared prompt starts), every request's outcome, times
    and counters under macro-steps are those of single steps (EngineConfig.macro_steps off)."""
    cfg = dict(
        clients="abcd", prefix_cache=prefix_cache, admission="optimistic" if optimistic else "conservative",
        pool_tokens=pool, max_wait_steps=max_wait_steps,
    )  # fmt: skip
    assert outcomes(requests, spec, macro_steps=True, **cfg) == outcomes(requests, spec, macro_steps=False, **cfg)


class CountingSim(SimBackend):
    """The simulator, counting forward passes and the decode steps they stand for."""

    def __init__(self):
        super().__init__(TESTBEDS["a10g-2024"])
        self.prefills = self.decodes = 0
        self.runs: dict[float, int] = {}  # a macro-step's start -> its decode steps

    def prefill(self, reqs):
        self.prefills += 1
        return super().prefill(reqs)

    def decode(self, reqs):
        self.decodes += 1
        return super().decode(reqs)

    def decode_run(self, reqs, steps, start, until):
        done, end = super().decode_run(reqs, steps, start, until)
        self.runs[start] = done  # the engine may time the steps again from the same start: its last answer counts
        return done, end

    @property
    def passes(self) -> int:
        return self.prefills + self.decodes + len(self.runs)

    @property
    def decode_steps(self) -> int:
        return self.decodes + sum(self.runs.values())


def overload_engine(macro_steps: bool, scheduler: str = "vtc") -> tuple[Engine, CountingSim, list[Request]]:
    exp = Experiment.of(suite="overload", scheduler=scheduler, duration=60)
    workload = exp.workload.build()
    backend = CountingSim()
    engine = make_engine(
        scheduler, backend, clients=workload.clients, base=exp.engine_config(), macro_steps=macro_steps
    )
    return engine, backend, exp.requests(workload)


@pytest.mark.parametrize("scheduler", ["vtc", "fcfs"])
def test_macro_steps_take_the_same_steps_in_far_fewer_passes(scheduler):
    engine, macro, requests = overload_engine(True, scheduler)
    engine.run(requests)
    engine, single, requests = overload_engine(False, scheduler)
    engine.run(requests)
    assert (macro.decode_steps, macro.prefills) == (single.decode_steps, single.prefills)
    assert single.passes == single.prefills + single.decode_steps  # single steps: one pass each
    # ~3,500 steps, 270 arrivals; once both clients have requests waiting, an arrival queues behind and
    # cuts no macro-step: they end at admissions and finishes, fewer than the arrivals (before, each cut one)
    assert macro.passes < 270


def test_an_on_step_observer_sees_every_step():
    engine, backend, requests = overload_engine(True)
    seen = []
    engine.run(requests, on_step=lambda: seen.append(engine.clock.now()))
    assert backend.passes == len(seen) == backend.prefills + backend.decode_steps


def test_step_without_until_is_one_forward_pass():
    engine, backend, requests = overload_engine(True)
    for r in requests[:5]:
        engine.add_request(r)
    while engine.step():
        pass
    assert all(r.state is State.FINISHED for r in requests[:5])
    assert backend.passes == backend.prefills + backend.decode_steps  # no pass stood for several steps


def test_step_until_stops_at_the_first_step_ending_at_or_after_it():
    engine, backend, requests = overload_engine(True)
    engine.add_request(requests[0])
    engine.step()  # the prefill
    start = engine.clock.now()
    single = [backend.model.decode_time(1, requests[0].prompt_len + k) for k in range(1, 6)]
    t, ends = start, []
    for e in single:
        t += e
        ends.append(t)
    engine.step(until=ends[2] - 1e-9)  # inside step 3
    assert engine.clock.now() == ends[2] and requests[0].generated == 4
    engine.step(until=ends[4])  # exactly at the end of step 5: that step is the last
    assert engine.clock.now() == ends[4] and requests[0].generated == 6


@given(st.integers(1, 40), st.integers(0, 300), st.integers(1, 400), st.integers(1, 60), st.floats(0, 1e4))
@settings(max_examples=200, deadline=None)
def test_decode_run_times_steps_as_single_steps_and_the_clock_add_them(n, generated, prompt, steps, until_offset):
    backend = SimBackend(TESTBEDS["a10g-2023"])
    reqs = [Request("c", prompt + i, 1000, 0.0, rid=i, generated=generated + i % 3) for i in range(n)]
    start = 17.25 + until_offset / 7
    until = start + until_offset / 1000
    done, end = backend.decode_run(reqs, steps, start, until)
    clock = VirtualClock(start)
    for k in range(steps):  # noqa: B007 (k, after the loop, is the last step taken)
        clock.advance(backend.decode(reqs).elapsed)
        for r in reqs:
            r.generated += 1
        if clock.now() >= until:
            break
    assert (done, end) == (k + 1, clock.now())


@pytest.mark.parametrize("cache", [False, True])
def test_extend_by_k_steps_gives_the_slots_of_k_single_steps(cache):
    def running(manager):
        reqs = [Request("c", 5 + i, 50, 0.0, rid=i) for i in range(4)]
        manager.admit(reqs)
        return reqs

    one, many = (MemoryManager(TokenPool(200), 0, cache=cache) for _ in range(2))
    a, b = running(one), running(many)
    for _ in range(7):
        one.extend(a)
    many.extend(b, 7)
    assert [r.kv_slots for r in a] == [r.kv_slots for r in b]
    assert one.pool.num_free == many.pool.num_free and list(one.pool._free) == list(many.pool._free)


def decoded(req: Request, steps: int) -> Request:
    twin = copy.copy(req)
    twin.generated += steps
    return twin


def check_first_fit(shapes, prompt, output, steps, pool, optimistic, used):
    """Brute force: after s steps, a fresh budget over the decoded batch, and try_add."""
    config = EngineConfig(pool_tokens=pool, admission="optimistic" if optimistic else "conservative")
    running = [Request("r", p, o, 0.0, rid=i, generated=min(g, o - 1)) for i, (p, o, g) in enumerate(shapes)]
    steps = min([steps, *(r.remaining for r in running)])  # no running request finishes inside
    candidate = Request("c", prompt, output, 0.0, rid=999)
    taken = int(used * pool)

    def pool_with(taken):  # optimistic admission looks at the slots available now
        memory = MemoryManager(TokenPool(pool), 0)
        memory.pool.alloc(min(pool, taken))
        return memory

    def fits_after(s):  # each running request takes one more slot per step
        return Budget(config, [decoded(r, s) for r in running], pool_with(taken + s * len(running))).try_add(candidate)

    first = 1 + len(shapes) % 3
    expected = next((s for s in range(first, steps) if fits_after(s)), None)
    assert first_fit(Budget(config, running, pool_with(taken)), candidate, range(first, steps)) == expected


@given(
    st.lists(st.tuples(st.integers(1, 600), st.integers(1, 600), st.integers(0, 599)), max_size=25),
    st.integers(1, 800),
    st.integers(1, 800),
    st.integers(1, 80),
    st.integers(2_000, 30_000),
    st.booleans(),
    st.floats(0, 1),
)
@settings(max_examples=300, deadline=None)
def test_first_fit_is_the_first_step_after_which_try_add_accepts(shapes, prompt, output, steps, pool, optimistic, used):
    check_first_fit(shapes, prompt, output, steps, pool, optimistic, used)


@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(1, 20), st.integers(0, 19)), max_size=4),
    st.integers(1, 8),
    st.integers(1, 20),
    st.integers(1, 20),
    st.integers(5, 120),
)
@example([(5, 12, 0)], 3, 10, 12, 28)  # the candidate's own entry binds: 28 < 28 does not fit at s = 2
@example([(5, 11, 0)], 3, 10, 11, 29)  # the running request falls behind the candidate at s = 3, and then it fits
@settings(max_examples=2_000, deadline=None)
@pytest.mark.slow
def test_first_fit_on_small_batches_where_every_boundary_is_hit(shapes, prompt, output, steps, pool):
    check_first_fit(shapes, prompt, output, steps, pool, False, 0.0)


def test_first_fit_finds_a_fit_no_finish_brings():
    """The worst case of the running batch with a candidate can fall while the batch only decodes:
    a request near its end holding much, and a long candidate."""
    running = [Request("r", 300, 400, 0.0, rid=0, generated=390)]  # 10 to go, holds 690
    candidate = Request("c", 50, 300, 0.0, rid=1)  # enters as (51 held, 299 to generate), first
    # after s steps the worst moment is the running request's end: (10 - s) * 2 + 51 + 690 + s = 761 - s,
    # against 299 + 51 = 350 at the candidate's; it fits once 761 - s < 755, at s = 7
    tight = EngineConfig(pool_tokens=755)
    assert first_fit(Budget(tight, running, None), candidate, range(0, 10)) == 7
    assert not Budget(tight, [decoded(running[0], 6)], None).try_add(candidate)
    assert Budget(tight, [decoded(running[0], 7)], None).try_add(candidate)
    assert first_fit(Budget(EngineConfig(pool_tokens=762), running, None), candidate, range(0, 10)) == 0


@pytest.mark.parametrize("scheduler", ["vtc", "lcf", "vtc-oracle"])
def test_vtc_heads_are_the_clients_select_would_take_after_each_step(scheduler):
    """Random backlogs and running batches; the brute force charges step by step and asks the heap."""
    rng = random.Random(7)
    clients = [f"client{i}" for i in range(6)]
    for trial in range(60):
        sched = build_scheduler(scheduler, clients)
        reqs = [
            Request(rng.choice(clients), rng.randint(1, 50), rng.randint(30, 60), float(i), rid=i) for i in range(20)
        ]
        for r in reqs:
            sched.on_arrival(r, r.arrival)
        budget = Budget(EngineConfig(pool_tokens=1_000_000), [], None)
        running = sched.select(FakeBudget(room=rng.randint(0, 300)), 0.0)
        for r in running:
            r.generated = 1
        if not running or not sched.num_waiting():
            continue
        steps = 25
        heads = sched.heads(running, steps, budget)
        assert heads is not None and heads[0][0] == 0
        twin_sched, twin_running = copy.deepcopy((sched, running))
        for s in range(steps):
            expected = twin_sched.clients[twin_sched.least_waiting()].queue[0].rid
            got = [req for start, req in heads if start <= s][-1].rid
            assert got == expected, (trial, s)
            twin_sched.on_decode_step(twin_running, 0.0)
            for r in twin_running:
                r.generated += 1
        # and k steps charged at once leave the counters k single steps leave
        assert sched.charge_steps(running, steps, 0.0)
        assert sched.counters() == twin_sched.counters()
