"""Scheduler overhead: `select` per admitted request, `Budget.try_add` alone, `on_decode_step`.

The operating point is the paper's overload run: 256/256-token requests, a 10,000-token pool
and a running batch of about 20 requests at staggered progress (continuous batching leaves
them so). Every client has waiting requests; a first request of a client-specific size,
admitted before timing, spreads the counters so that VTC's heap really has to order clients.
"""

import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from slora_vtc.config import EngineConfig
from slora_vtc.memory.admission import Budget
from slora_vtc.request import Request
from slora_vtc.sched import Scheduler, build_scheduler

PROMPT_LEN = OUTPUT_LEN = 256  # the overload suite's requests
POOL_TOKENS = 10_000  # A10G / Llama-7B, the paper's default pool
RUNNING_BATCH = 20  # requests running at the overload operating point
RUNNING_CLIENTS = 2  # the overload suite has two clients
SPREAD_SEED = 42


class AdmitFirst:
    """A stand-in budget that admits the first `n` requests offered, whatever their size."""

    def __init__(self, n: int):
        self.left = n

    def try_add(self, req: Request) -> bool:
        self.left -= 1
        return self.left >= 0


@contextmanager
def gc_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector out of the timed region (as `timeit` does)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def median_of(repeats: int, measure: Callable[[], float]) -> tuple[float, list[float]]:
    samples = [measure() for _ in range(repeats)]
    return statistics.median(samples), samples


def client_name(i: int) -> str:
    return f"client{i}"


def overload_request(client: str, rid: int, prompt_len: int = PROMPT_LEN) -> Request:
    return Request(client, prompt_len, OUTPUT_LEN, 0.0, rid=rid, adapter=client)


def running_batch(size: int, clients: int = RUNNING_CLIENTS, staggered: bool = True) -> list[Request]:
    """`size` running overload requests, their progress spread evenly over the output length
    (or all just prefilled: a batch that leaves no room for another 256/256 request)."""
    batch = []
    for k in range(size):
        req = overload_request(f"running{k % clients}", rid=-1 - k)
        req.generated = 1 + k * (OUTPUT_LEN - 1) // size if staggered else 1
        batch.append(req)
    return batch


def pool_for(running_size: int) -> int:
    """The pool that gives `running_size` requests the overload point's headroom (10k for 20)."""
    return POOL_TOKENS * running_size // RUNNING_BATCH


# -- select ---------------------------------------------------------------------------------
def waiting_scheduler(spec: str, clients: int, per_client: int) -> Scheduler:
    """A scheduler whose `clients` clients each have `per_client` waiting overload requests.

    Each client first sends one request of a random size in [1, 1024) tokens; admitting those
    (outside any timing) leaves the counters spread over that range.
    """
    names = [client_name(i) for i in range(clients)]
    scheduler = build_scheduler(spec, names)
    rng = random.Random(SPREAD_SEED)
    rids = itertools.count()
    for name in names:
        scheduler.on_arrival(overload_request(name, next(rids), prompt_len=rng.randrange(1, 1024)), 0.0)
    for _ in range(per_client):
        for name in names:
            scheduler.on_arrival(overload_request(name, next(rids)), 0.0)
    scheduler.select(AdmitFirst(clients), 0.0)
    return scheduler


def select_cost(spec: str, clients: int, admissions: int) -> tuple[float, float]:
    """Nanoseconds of `select` per admitted request, and requests admitted per call.

    Every call gets a fresh Budget over the same running batch (built outside the timing), so
    each call admits what fits beside 20 running requests and stops at the first non-fit.
    """
    config, running = EngineConfig(pool_tokens=POOL_TOKENS), running_batch(RUNNING_BATCH)
    scheduler = waiting_scheduler(spec, clients, per_client=admissions // clients + 2)
    elapsed_ns = admitted = calls = 0
    with gc_paused():
        while admitted < admissions:
            budget = Budget(config, running)
            start = time.perf_counter_ns()
            batch = scheduler.select(budget, 0.0)
            elapsed_ns += time.perf_counter_ns() - start
            if not batch:
                raise RuntimeError(f"{spec} admitted nothing with {clients} clients")
            admitted, calls = admitted + len(batch), calls + 1
    return elapsed_ns / admitted, admitted / calls


def empty_select_cost(spec: str, clients: int, calls: int) -> float:
    """Nanoseconds of a `select` call that admits nothing: the head request does not fit.

    Most calls are like this: in the simulated overload run, 99% of select calls admit nothing
    (the engine asks again on every decode step once 10 steps passed without an admission).
    """
    config, running = EngineConfig(pool_tokens=POOL_TOKENS), running_batch(RUNNING_BATCH, staggered=False)
    scheduler = waiting_scheduler(spec, clients, per_client=1)
    budgets = [Budget(config, running) for _ in range(calls)]
    with gc_paused():
        start = time.perf_counter_ns()
        admitted = [scheduler.select(budget, 0.0) for budget in budgets]
        elapsed_ns = time.perf_counter_ns() - start
    if any(admitted):
        raise RuntimeError(f"{spec} admitted a request beside a full running batch")
    return elapsed_ns / calls


# -- Budget.try_add -------------------------------------------------------------------------
def try_add_cost(running_size: int, calls: int) -> float:
    """Nanoseconds of one accepted `try_add` on a fresh Budget over `running_size` requests."""
    config, running = EngineConfig(pool_tokens=pool_for(running_size)), running_batch(running_size)
    candidate = overload_request("candidate", rid=0)
    budgets = [Budget(config, running) for _ in range(calls)]
    with gc_paused():
        start = time.perf_counter_ns()
        accepted = [budget.try_add(candidate) for budget in budgets]
        elapsed_ns = time.perf_counter_ns() - start
    if not all(accepted):
        raise RuntimeError(f"the candidate does not fit beside {running_size} running requests")
    return elapsed_ns / calls


# -- on_decode_step -------------------------------------------------------------------------
def decode_step_cost(spec: str, running_size: int, calls: int) -> float:
    """Nanoseconds of `on_decode_step` per running request, for a batch admitted by `spec`."""
    names = [client_name(i) for i in range(RUNNING_CLIENTS)]
    scheduler = build_scheduler(spec, names)
    for k in range(running_size):
        scheduler.on_arrival(overload_request(names[k % len(names)], rid=k), 0.0)
    running = scheduler.select(AdmitFirst(running_size), 0.0)
    for k, req in enumerate(running):
        req.generated = 1 + k * (OUTPUT_LEN - 1) // running_size
    with gc_paused():
        start = time.perf_counter_ns()
        for _ in range(calls):
            scheduler.on_decode_step(running, 0.0)
        elapsed_ns = time.perf_counter_ns() - start
    return elapsed_ns / (calls * running_size)
