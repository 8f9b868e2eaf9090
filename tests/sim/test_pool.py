"""The token pool and memory manager never leak a slot, whatever the engine runs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slora_vtc.backends.sim import A10G_STEP_MODEL, SimBackend
from slora_vtc.builder import build_engine
from slora_vtc.clock import VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.memory import MemoryManager, PoolExhausted, TokenPool
from slora_vtc.sched import build_scheduler
from slora_vtc.suites import get_suite
from tests.helpers.engine import FixedBackend, assert_clean, make_engine, req


def test_alloc_and_free_restore_the_pool():
    pool = TokenPool(10)
    a, b = pool.alloc(4), pool.alloc(6)
    assert pool.num_free == 0 and pool.num_used == 10
    assert sorted(np.concatenate([a, b]).tolist()) == list(range(10))
    pool.free(a)
    assert pool.num_free == 4
    c = pool.alloc(4)
    assert sorted(c.tolist()) == sorted(a.tolist())
    pool.free(b)
    pool.free(c)
    assert pool.num_free == 10


def test_alloc_beyond_free_slots_raises():
    pool = TokenPool(5)
    pool.alloc(3)
    with pytest.raises(PoolExhausted):
        pool.alloc(3)
    assert pool.num_free == 2


def test_double_free_raises():
    pool = TokenPool(8)
    slots = pool.alloc(3)
    pool.free(slots)
    with pytest.raises(ValueError, match="double free"):
        pool.free(slots)
    assert pool.num_free == 8


def test_free_of_unallocated_or_repeated_slot_raises():
    pool = TokenPool(8)
    slots = pool.alloc(2)
    with pytest.raises(ValueError):
        pool.free([slots[0], slots[0]])
    free_slot = next(s for s in range(8) if s not in slots)
    with pytest.raises(ValueError):
        pool.free([free_slot])
    assert pool.num_free == 6


def test_memory_manager_loads_each_adapter_once_and_evicts_unused():
    pool = TokenPool(100)
    mm = MemoryManager(pool, adapter_slots=8)
    a1, a2, b1 = req("a", 10, 5, adapter="A"), req("a", 5, 5, adapter="A"), req("b", 7, 5, adapter="B")
    mm.admit([a1, a2, b1])
    assert set(mm.adapters) == {"A", "B"}
    assert pool.num_used == 10 + 5 + 7 + 2 * 8
    mm.extend([a1, b1])
    assert len(a1.kv_slots) == 11 and len(b1.kv_slots) == 8
    mm.release(b1)
    mm.evict_unused([a1, a2])
    assert set(mm.adapters) == {"A"}
    for r in (a1, a2):
        mm.release(r)
    mm.evict_unused([])
    assert pool.num_free == 100 and mm.adapters == {}


def test_memory_manager_gives_each_adapter_its_own_size():
    pool = TokenPool(100)
    mm = MemoryManager(pool, {"A": 3, "B": 17}.__getitem__)
    a, b = req("a", 10, 5, adapter="A"), req("b", 7, 5, adapter="B")
    mm.admit([a, b])
    assert {name: len(slots) for name, slots in mm.adapters.items()} == {"A": 3, "B": 17}
    assert pool.num_used == 10 + 7 + 3 + 17
    mm.release(a)
    mm.evict_unused([b])
    assert pool.num_used == 7 + 17
    mm.release(b)
    mm.evict_unused([])
    assert pool.num_free == 100


@pytest.mark.parametrize("spec", ["fcfs", "rpm:20", "vtc", "lcf", "wvtc:1,2", "vtc-oracle", "vtc-pred:0.5", "vtc-avg"])
@pytest.mark.parametrize("suite", ["overload", "on_off_overload", "poisson_short_long_2"])
def test_suite_runs_leave_the_pool_empty(suite, spec):
    workload = get_suite(suite).workload(duration=40)
    requests = workload.requests()
    clock = VirtualClock()
    engine = build_engine(
        EngineConfig(), build_scheduler(spec, list(workload.clients)), SimBackend(A10G_STEP_MODEL), clock
    )
    engine.run(requests)
    assert_clean(engine, requests)
    assert any(r.state.value == "finished" for r in requests)


lengths = st.tuples(st.integers(1, 120), st.integers(1, 80), st.floats(0, 20), st.sampled_from("abc"))


@settings(max_examples=25, deadline=None)
@given(st.lists(lengths, min_size=1, max_size=30), st.sampled_from(["fcfs", "vtc", "lcf", "rpm:3", "vtc-pred:0.5"]))
def test_random_runs_never_leak(specs, spec):
    reqs = [req(c, p, o, t, adapter=c) for p, o, t, c in specs]
    engine = make_engine(
        build_scheduler(spec, ["a", "b", "c"]),
        pool_tokens=200,
        lora_rank=2,
        max_wait_steps=3,
        backend=FixedBackend(0.5, 0.05),
    )
    engine.run(reqs)
    assert_clean(engine, reqs)
    assert engine.memory.pool.size == 200
