"""The admission check every scheduler shares (S-LoRA's router; docs/design.md, "The memory pool and
the admission check").

Each request is a pair (tokens held now, tokens still to generate). Sorted by tokens to generate,
descending, the pool must hold max_i(to_generate[i] * (i + 1) + cumulative_held[i]) tokens at
the worst future moment; a batch is admitted only if that is below the pool minus adapter slots.

With the prefix cache, a request's cached tokens are the tree's: every slot on a path some request
locks is reserved once, and only a request's own tokens (what its prefill computes, then what it
generates) enter the formula. Unlocked cached slots count as free: they are evicted on demand.

Optimistic admission (vLLM's) reserves nothing for the future: a request is admitted while the
slots its prefill needs are available now; the engine preempts when a decode step runs short.
"""

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from operator import itemgetter
from typing import TYPE_CHECKING

from slora_vtc.config import EngineConfig
from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request

if TYPE_CHECKING:
    from slora_vtc.memory.manager import MemoryManager


def peak_need(to_generate_desc: list[int], held: list[int]) -> int:
    """Worst-case future pool usage of requests sorted by tokens to generate, descending."""
    return max(
        (t * (i + 1) + c for i, (t, c) in enumerate(zip(to_generate_desc, accumulate(held)))),
        default=0,
    )


def fits_alone(req: Request, config: EngineConfig) -> bool:
    """Whether the request could ever be admitted (into an empty engine). Under chunked batching: its
    K/V at the end (every token but the last, whose K/V is never computed) in whole blocks, and its
    adapter, fit the pool (there is no prompt cap: prompts are prefilled in chunks)."""
    if config.chunked:
        own = config.round_up(req.prompt_len + req.max_new_tokens - 1)
        return own + config.slots_of(req.adapter) <= config.pool_tokens
    return (
        req.prompt_len <= config.batch_max_tokens
        and req.prompt_len + req.max_new_tokens < config.pool_tokens - config.slots_of(req.adapter)
    )


@dataclass(frozen=True)
class Costs:
    """What admitting one request takes, beyond the tokens of its own prefill and output."""

    extend: int  # tokens its prefill computes (the rest of it is cached)
    locking: int  # cached slots it would reserve that nothing reserves yet
    new_adapter: int  # slots of its adapter, when no request of the batch uses that adapter yet

    @property
    def now(self) -> int:
        """Slots its prefill takes at once (what optimistic admission checks)."""
        return self.extend + self.locking + self.new_adapter


class Budget(AdmissionBudget):
    """What one scheduling round may still admit, given the running batch.

    Schedulers call `try_add(req)` in their own order; it returns whether the request fits with
    everything admitted so far and, if so, counts it in. `cached_len(req)` tells how many tokens of
    its prefill the prefix cache holds (0 without a cache). The running batch's entries, sorted by
    tokens to generate (`neg_to_generate`, ascending, and `held`), are read by the macro-steps'
    `first_fit` (slora_vtc/macro_step.py) as well.
    """

    def __init__(self, config: EngineConfig, running: list[Request], memory: "MemoryManager | None" = None):
        self.config = config
        self.optimistic = config.admission == "optimistic"
        self._running = running  # read when first needed (a round's check, before the batch changes)
        self._memory = memory
        self._cache = memory.cache if memory is not None else None
        self.reserved = (
            self._cache.locked if self._cache else 0
        )  # cached slots held by running requests (and this round's)
        self._seen: dict[int, int] = {}  # tree nodes this round has reserved: node id -> tokens of it
        self.available = memory.available if memory is not None else config.pool_tokens  # optimistic: slots left now
        self._prompt_tokens = 0
        self.terms: tuple | None = None  # the macro-steps' terms of these entries (macro_step.running_terms)

    @cached_property
    def _adapters(self) -> set[str]:
        """The adapters of the running batch, and of what this round admitted."""
        return {r.adapter for r in self._running if r.adapter is not None}

    @cached_property
    def adapter_slots(self) -> int:
        """Slots of the resident adapters and of this round's new ones, each at its size."""
        return sum(self.config.slots_of(a) for a in self._adapters)

    @cached_property
    def _entries(self) -> tuple[list[int], list[int]]:
        """The running batch sorted once (stable: ties keep the running order, as inserting one by
        one after equals would) by -remaining, with the tokens each holds; the pairs are made
        without the properties' calls, the hottest loop here. A macro-step that asks a scheduler
        which cannot say what it would admit never sorts them."""
        memory = self._memory
        shared = memory.shared_tokens if memory is not None and memory.cache is not None else None
        if shared:
            pairs = [(-r.remaining, r.held_tokens - shared(r)) for r in self._running]
        else:
            pairs = [(r.generated - r.max_new_tokens, r.prompt_len + r.generated) for r in self._running]
        entries = sorted(pairs, key=itemgetter(0))
        return [neg for neg, _ in entries], [held for _, held in entries]

    @property
    def neg_to_generate(self) -> list[int]:
        """-tokens to generate of each entry, ascending (to generate descending)."""
        return self._entries[0]

    @property
    def held(self) -> list[int]:
        """Tokens each entry holds, in the order of neg_to_generate."""
        return self._entries[1]

    @property
    def count(self) -> int:
        """Entries: the running batch and what this round admitted."""
        return len(self._entries[0])

    def cached_len(self, req: Request) -> int:
        return self._memory.cached_len(req) if self._cache else 0

    @property
    def full(self) -> bool:
        """No request more may run (S-LoRA's cap on the running batch)."""
        return self.count + 1 > self.config.max_running

    def costs(self, req: Request, seen: dict[int, int] | None = None) -> Costs:
        """What admitting `req` now would take (`seen`: the tree nodes it would reserve are added to it)."""
        extend = req.prefill_len - self.cached_len(req)
        new_adapter = req.adapter is not None and req.adapter not in self._adapters
        locking = self._newly_locked(req, dict(self._seen) if seen is None else seen)
        return Costs(extend, locking, self.config.slots_of(req.adapter) if new_adapter else 0)

    def try_add(self, req: Request) -> bool:
        if self.full:
            return False
        extend = req.prefill_len - self.cached_len(req)
        if self._prompt_tokens and self._prompt_tokens + extend > self.config.batch_max_tokens:
            return False  # (a resumed request longer than the cap still goes alone)
        seen = dict(self._seen)
        costs = self.costs(req, seen)
        if self.optimistic:
            fits = costs.now < self.available
        else:
            taken = self.adapter_slots + costs.new_adapter + self.reserved + costs.locking
            fits = self._fits_worst_case(req.remaining - 1, extend + 1, taken)
        if not fits:
            return False
        self.available -= costs.now
        self.reserved += costs.locking
        self._seen = seen
        self._insert(req.remaining - 1, extend + 1)
        self._prompt_tokens += extend
        if costs.new_adapter:
            self._adapters.add(req.adapter)
            self.adapter_slots += costs.new_adapter
        return True

    def _newly_locked(self, req: Request, seen: dict[int, int]) -> int:
        ids = self._memory.cache_ids(req) if self._cache else None
        return 0 if ids is None else self._cache.unlocked_len(req.adapter, ids, req.prefill_len - 1, seen)

    def _fits_worst_case(self, to_generate: int, held: int, taken: int) -> bool:
        pos = bisect_right(self.neg_to_generate, -to_generate)
        need = peak_need(
            [-n for n in self.neg_to_generate[:pos]] + [to_generate] + [-n for n in self.neg_to_generate[pos:]],
            self.held[:pos] + [held] + self.held[pos:],
        )
        return need < self.config.pool_tokens - taken

    def _insert(self, to_generate: int, held: int) -> None:
        self.terms = None
        pos = bisect_right(self.neg_to_generate, -to_generate)
        self.neg_to_generate.insert(pos, -to_generate)
        self.held.insert(pos, held)
