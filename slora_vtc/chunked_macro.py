"""Macro-steps of chunked batching (simulator; docs/design.md, "Macro-steps"): the pure decode steps
that single steps of slora_vtc/chunked.py would run alike run as one, with the same results.

Alike means: nothing in prefill, every running request decoding within the token budget, no request
short of a block (no preemption; with the prefix cache, no eviction either, unless its evictions
are its single steps': `_may_evict`), and nothing admitted from the waiting queue: none can be (the
budget or the sequence cap is used up, or not a block is free), or the request the scheduler would
try at each step (`LookAhead.heads`) provably does not fit. The steps end at the first finish, and
the backend stops them at the next arrival that does not queue behind (`decode_run`, `Engine.arrival_horizon`).
"""

from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from slora_vtc.memory.budget import CacheHits

if TYPE_CHECKING:
    from slora_vtc.chunked import ChunkedBatching
    from slora_vtc.engine import Horizon
    from slora_vtc.request import Request


def decoded_to(req: "Request") -> int:
    """Positions whose K/V a running request whose prefill is complete has computed: all but its newest token's."""
    return req.prompt_len + req.generated - 1


def spare_slots(running: list["Request"], block_size: int) -> list[int]:
    """Each decoding request's unwritten slots in its last block: its computed positions beyond its
    cached prefix (whose blocks are shared), decoded_to(r) - r.cached_len, taken from whole blocks."""
    return [(r.cached_len + 1 - r.prompt_len - r.generated) % block_size for r in running]


def slots_to_grow(spare: list[int], steps: int, block_size: int) -> list[int]:
    """The slots each request with `spare` unwritten slots in its last block takes for `steps` more tokens."""
    return [-((p - steps) // block_size) * block_size if steps > p else 0 for p in spare]


class DecodeBlocks:
    """When the decode steps of a batch take blocks. A request with `p` unwritten slots in its last
    block takes a block at step p + 1, then every block_size steps; sorted by p, the blocks of round
    r (steps r * block_size + 1 ..) all come before those of round r + 1."""

    def __init__(self, spare: list[int], block_size: int):
        self.spare, self.block_size = sorted(spare), block_size

    def within(self, steps: int) -> int:
        """Blocks the first `steps` decode steps take."""
        rounds, rest = divmod(steps, self.block_size)
        return len(self.spare) * rounds + bisect_left(self.spare, rest)

    def steps_taking_at_most(self, blocks: int) -> int:
        """The most decode steps whose blocks number at most `blocks`: those before the step that
        takes block number blocks + 1."""
        rounds, i = divmod(blocks, len(self.spare))
        return self.spare[i] + rounds * self.block_size


class Alike(NamedTuple):
    steps: int  # decode steps from now that single steps would run alike (0: none)
    to_finish: int  # decode steps until the first running request finishes
    spare: Sequence[int] = ()  # spare_slots of the running requests when this was found (for decode_ahead)


NONE_ALIKE = Alike(0, 0)


def alike_steps(chunked: "ChunkedBatching") -> Alike:
    """Pure decode steps from now that single steps would run alike (module docstring)."""
    eng, config, memory = chunked.engine, chunked.config, chunked.engine.memory
    running = eng.running
    n = len(running)
    if not n or chunked.prefilling or n > config.max_num_batched_tokens:
        return NONE_ALIKE
    to_finish = min([r.max_new_tokens - r.generated for r in running])  # the step in which one finishes is the last
    bs = config.block_size
    spare = spare_slots(running, bs)
    blocks = DecodeBlocks(spare, bs)
    admits = n < config.max_num_batched_tokens and n < config.max_num_seqs and memory.available >= bs
    evicts = _may_evict(memory, eng.scheduler, admits)
    room = memory.available if evicts else memory.pool.num_free  # the same without the prefix cache
    steps = min(to_finish, blocks.steps_taking_at_most(room // bs))
    if steps and admits and eng.scheduler.num_waiting():
        steps = _until_admission(chunked, blocks, steps, evicts)
    return Alike(steps, to_finish, spare)


def _may_evict(memory, scheduler, admits: bool) -> bool:
    """Whether alike steps may take evictable slots too (with the prefix cache: without it there
    are none). An eviction shrinks what waiting requests would find cached, which a macro-step must not
    hide from the steps that would see it; it may when evictions trim leaves (chunked batching: a
    macro-step's allocation then evicts what its single steps' would, the same tokens in the same
    order, as nothing touches the tree in between) and nothing can be admitted, or the scheduler's
    order does not read the cache (then `_until_admission` checks a bound that evictions cannot lower)."""
    cache = memory.cache
    return cache is not None and cache.trim_leaves and (not admits or not scheduler.traits.needs_token_ids)


def _until_admission(chunked: "ChunkedBatching", blocks: DecodeBlocks, steps: int, evicts: bool) -> int:
    """The decode steps before the first at which the waiting pass might admit its head (steps if
    at none). Step j (from 1) peeks after j - 1 steps' charges, with what the running pass of j
    leaves available, which only falls: a head that does not fit at its first step never does.
    A head needs its whole prefill's blocks beyond its hit. Where the steps may evict (`evicts`,
    with the prefix cache) that hit may shrink on the way, and with it the cached slots it would
    lock: its need is bounded below by its blocks at today's hit, the locking left out."""
    eng, memory, config = chunked.engine, chunked.engine.memory, chunked.config
    view = CacheHits(memory)
    heads = eng.scheduler.heads(eng.running, steps, view) if eng.scheduler.traits.lookahead else None
    if heads is None:
        return 0
    available = memory.available
    for s, req in heads:
        if s >= steps:
            break
        need = config.round_up(req.prefill_len - view.cached_len(req))
        if not evicts:
            need += memory.start_cost(req)
        if need <= available - config.block_size * blocks.within(s + 1):
            return s
    return steps


def decode_ahead(chunked: "ChunkedBatching", alike: Alike, until: float, horizon: "Horizon | None" = None) -> bool:
    """Run the alike decode steps at once, stopping at the first that ends at or after `until`,
    or, given `horizon`, at or after the first event it names before they end (Engine.step).
    Returns whether they ended where the next step is likely not alike: one that may admit or
    preempt, or a finish with requests waiting (always safe: a single step is the rule itself)."""
    eng, block = chunked.engine, chunked.config.block_size
    running = eng.running
    steps, end = eng.decode_run(alike.steps, until, horizon)
    before_last = steps - 1  # the running list is ordered as the last step's start orders it, where it counts
    if not _ordered_victims_last(chunked, alike, steps):
        _grow_and_charge(chunked, alike.spare, steps)
    elif (order := eng.scheduler.victim_order_after(running, before_last, eng.clock.now())) is not None:
        order.reverse()
        spare = alike.spare
        if order != running:  # requests compare by identity
            running[:] = order
            spare = spare_slots(running, block)
        _grow_and_charge(chunked, spare, steps)
    else:  # the order the charges of the steps before the last give
        _grow_and_charge(chunked, alike.spare, before_last)
        chunked.order_victims_last()
        _grow_and_charge(chunked, spare_slots(running, block), 1)
    eng.clock.wait_until(end)
    if steps < alike.steps:  # stopped by the backend at `until`
        return False
    if steps == alike.to_finish:
        eng._retire(running)
        return eng.scheduler.num_waiting() > 0
    return True


def _ordered_victims_last(chunked: "ChunkedBatching", alike: Alike, steps: int) -> bool:
    """Whether the running list must be ordered as the last of `steps` alike steps orders it: where
    it may preempt (sched/victims.py) and the steps end in a finish. Otherwise either no step orders
    it, or the next single step may preempt too (nothing freed a block since) and orders it afresh
    before anything reads the order: a macro-step reads none."""
    if steps != alike.to_finish:
        return False
    block = chunked.config.block_size
    taken = DecodeBlocks(alike.spare, block).within(steps - 1)
    return chunked.may_preempt(chunked.engine.memory.available // block - taken)


def _grow_and_charge(chunked: "ChunkedBatching", spare: Sequence[int], steps: int) -> None:
    """`steps` decode steps of the running requests, which have `spare` unwritten slots each."""
    eng = chunked.engine
    eng.memory.grow_all(eng.running, steps, slots_to_grow(spare, steps, chunked.config.block_size))
    eng._charge_and_grow(steps)
