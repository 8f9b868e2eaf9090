"""The counting pool of simulated runs: the same free counts as the slot pool, step by step."""

import pytest

from slora_vtc.backends.sim import A10G_STEP_MODEL, SimBackend
from slora_vtc.builder import build_memory
from slora_vtc.clock import VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.engine import Engine
from slora_vtc.memory import CountingPool, MemoryManager, PoolExhausted, TokenPool
from slora_vtc.request import Request, State
from slora_vtc.sched import build_scheduler
from slora_vtc.suites import get_suite


def test_alloc_and_free_count():
    pool = CountingPool(10)
    assert pool.alloc(4) == 4 and pool.alloc(6) == 6
    assert pool.num_free == 0 and pool.num_used == 10
    pool.free(4)
    assert pool.num_free == 4 and pool.num_used == 6


def test_alloc_beyond_free_slots_raises_and_takes_nothing():
    pool = CountingPool(5)
    pool.alloc(3)
    with pytest.raises(PoolExhausted):
        pool.alloc(3)
    assert pool.num_free == 2


def test_freeing_more_than_allocated_raises_and_frees_nothing():
    pool = CountingPool(8)
    pool.alloc(3)
    pool.free(3)
    with pytest.raises(ValueError, match="double free"):
        pool.free(3)
    pool.alloc(2)
    with pytest.raises(ValueError, match="double free"):
        pool.free(5)
    assert pool.num_used == 2


@pytest.mark.parametrize("kw", [{"cache": True}, {"on_load": lambda name, slots: None}])
def test_counting_pool_refuses_what_needs_slot_ids(kw):
    with pytest.raises(ValueError, match="slot ids"):
        MemoryManager(CountingPool(100), 8, **kw)


class LoadingBackend(SimBackend):
    """A simulated backend that is told, like a real one, where each adapter lands."""

    simulated = False


@pytest.mark.parametrize(
    "backend, prefix_cache, counting",
    [
        (SimBackend(A10G_STEP_MODEL), False, True),
        (SimBackend(A10G_STEP_MODEL), True, False),
        (LoadingBackend(A10G_STEP_MODEL), False, False),
    ],
)
def test_build_memory_counts_only_where_nothing_reads_slot_ids(backend, prefix_cache, counting):
    memory = build_memory(EngineConfig(pool_tokens=500, prefix_cache=prefix_cache), backend)
    assert isinstance(memory.pool, CountingPool if counting else TokenPool)
    assert memory.pool.size == 500 and (memory.cache is not None) == prefix_cache


def test_manager_counts_what_each_request_holds():
    memory = MemoryManager(CountingPool(100), adapter_slots=8)
    a, b = Request("a", 10, 5, 0.0, rid=0, adapter="A"), Request("b", 7, 5, 0.0, rid=1, adapter="B")
    memory.admit([a, b])
    assert memory.pool.num_used == 10 + 7 + 2 * 8 and memory.adapters == {"A": 8, "B": 8}
    memory.extend([a, b], 3)
    memory.extend([a])
    assert memory.pool.num_used == 10 + 7 + 2 * 8 + 2 * 3 + 1
    memory.release(a)
    memory.evict_unused([b])
    assert memory.pool.num_used == 7 + 3 + 8 and set(memory.adapters) == {"B"}
    memory.release(b)
    memory.evict_unused([])
    assert memory.pool.num_free == 100 and a.kv_slots == [] and b.kv_slots == []


def pool_trace(pool, spec: str, suite: str, admission: str) -> tuple[list, list]:
    """Single steps of a 40 s run: the pool's use and the resident adapters after each, and each
    request's end."""
    workload = get_suite(suite).workload(duration=40)
    requests = workload.requests()
    config = EngineConfig(pool_tokens=3000, admission=admission)
    memory = MemoryManager(pool, config.slots_of)
    engine = Engine(
        config, build_scheduler(spec, list(workload.clients)), SimBackend(A10G_STEP_MODEL), VirtualClock(), memory
    )
    seen = []
    engine.run(requests, on_step=lambda: seen.append((memory.pool.num_used, sorted(memory.adapters))))
    assert memory.pool.num_free == 3000 and memory.adapters == {}
    return seen, [(r.state, r.finish_time, r.preemptions) for r in requests]


@pytest.mark.parametrize(
    "spec, suite, admission",
    [
        ("vtc", "overload", "conservative"),
        ("fcfs", "poisson_short_long_2", "conservative"),
        ("vtc", "overload", "optimistic"),
        ("lcf", "on_off_overload", "optimistic"),
    ],
)
def test_counting_pool_follows_the_slot_pool_step_by_step(spec, suite, admission):
    counted, ends = pool_trace(CountingPool(3000), spec, suite, admission)
    slotted, slot_ends = pool_trace(TokenPool(3000), spec, suite, admission)
    assert counted == slotted and ends == slot_ends
    assert any(state is State.FINISHED for state, _, _ in ends)
    if admission == "optimistic":  # the small pool makes it preempt: release of a running request is counted too
        assert any(preemptions for _, _, preemptions in ends)
