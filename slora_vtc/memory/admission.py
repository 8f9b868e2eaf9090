"""The admission check every scheduler shares (S-LoRA's router; docs/design.md, "The memory pool and the admission check").

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
from itertools import accumulate
from operator import itemgetter
from typing import TYPE_CHECKING

from slora_vtc.config import EngineConfig
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
    """Whether the request could ever be admitted (into an empty engine)."""
    return (
        req.prompt_len <= config.batch_max_tokens
        and req.prompt_len + req.max_new_tokens < config.pool_tokens - config.slots_of(req.adapter)
    )


class Budget:
    """What one scheduling round may still admit, given the running batch.

    Schedulers call `try_add(req)` in their own order; it returns whether the request fits with
    everything admitted so far and, if so, counts it in. `cached_len(req)` tells how many tokens of
    its prefill the prefix cache holds (0 without a cache).
    """

    def __init__(self, config: EngineConfig, running: list[Request], memory: "MemoryManager | None" = None):
        self.config = config
        self._memory = memory
        self._cache = memory.cache if memory is not None else None
        self._optimistic = config.admission == "optimistic"
        self._adapters = {r.adapter for r in running if r.adapter is not None}
        self._adapter_slots = sum(
            config.slots_of(a) for a in self._adapters
        )  # resident + admitted this round, each at its size
        self._reserved = (
            self._cache.locked if self._cache else 0
        )  # cached slots held by running requests (and this round's)
        self._seen: dict[int, int] = {}  # tree nodes this round has reserved: node id -> tokens of it
        self._available = memory.available if memory is not None else config.pool_tokens  # optimistic: slots left now
        self._prompt_tokens = 0
        shared = memory.shared_tokens if memory is not None and memory.cache is not None else None
        # sorted once (stable: ties keep the running order, as inserting one by one after equals would)
        entries = sorted(
            ((-r.remaining, r.held_tokens - (shared(r) if shared else 0)) for r in running), key=itemgetter(0)
        )
        self._neg_to_generate: list[int] = [neg for neg, _ in entries]  # ascending, i.e. to_generate descending
        self._held: list[int] = [held for _, held in entries]
        self._count = len(entries)

    def cached_len(self, req: Request) -> int:
        return self._memory.cached_len(req) if self._cache else 0

    def try_add(self, req: Request) -> bool:
        if self._count + 1 > self.config.max_running:
            return False
        extend = req.prefill_len - self.cached_len(req)
        if self._prompt_tokens and self._prompt_tokens + extend > self.config.batch_max_tokens:
            return False  # (a resumed request longer than the cap still goes alone)
        new_adapter = req.adapter is not None and req.adapter not in self._adapters
        new_adapter_slots = self.config.slots_of(req.adapter) if new_adapter else 0
        seen = dict(self._seen)
        locking = self._newly_locked(req, seen)
        if self._optimistic:
            fits = extend + locking + new_adapter_slots < self._available
        else:
            fits = self._fits_worst_case(
                req.remaining - 1, extend + 1, self._adapter_slots + new_adapter_slots + self._reserved + locking
            )
        if not fits:
            return False
        self._available -= extend + locking + new_adapter_slots
        self._reserved += locking
        self._seen = seen
        self._insert(req.remaining - 1, extend + 1)
        self._prompt_tokens += extend
        if new_adapter:
            self._adapters.add(req.adapter)
            self._adapter_slots += new_adapter_slots
        return True

    def first_fit(self, req: Request, steps: range) -> int | None:
        """On a budget nothing was added to: the first s in `steps` after which `req` would fit if the
        running batch only decoded s more steps (each running request holding s tokens more and
        generating s fewer; no arrival, finish, admission or eviction); None if after none.

        try_add's check for every s at once. Sorted by tokens to generate, running entry i counts
        t_i * (i + 1) + H_i while ahead of the candidate and t_i * (i + 2) + H_i + held - s behind it
        (t, H: to generate and cumulative held before the steps); the candidate, p entries ahead,
        counts to_generate * (p + 1) + H_(p-1) + s * p + held. p only falls as s grows, and while it
        stays, the s that fit are an interval found in integers."""
        if self._count + 1 > self.config.max_running or not steps:
            return None
        extend = req.prefill_len - self.cached_len(req)
        new_adapter_slots = (
            self.config.slots_of(req.adapter) if req.adapter is not None and req.adapter not in self._adapters else 0
        )
        locking = self._newly_locked(req, dict(self._seen))
        if self._optimistic:  # what is available only shrinks, by one slot per running request and step
            return steps[0] if extend + locking + new_adapter_slots < self._available - steps[0] * self._count else None
        limit = self.config.pool_tokens - (self._adapter_slots + new_adapter_slots + self._reserved + locking)
        to_generate, held = req.remaining - 1, extend + 1
        t, cum = [-n for n in self._neg_to_generate], list(accumulate(self._held))
        ahead = list(accumulate((ti * (i + 1) + ci for i, (ti, ci) in enumerate(zip(t, cum))), max, initial=-1))
        behind = list(
            accumulate(
                (ti * (i + 2) + ci + held for i, (ti, ci) in reversed(list(enumerate(zip(t, cum))))), max, initial=-1
            )
        )[::-1]
        s = steps.start
        while s < steps.stop:
            p = bisect_right(self._neg_to_generate, -(to_generate + s))  # running entries ahead of the candidate
            stop = steps.stop if p == 0 else min(steps.stop, t[p - 1] - to_generate + 1)  # p holds for s in [s, stop)
            if ahead[p] < limit:
                first = max(s, behind[p] - limit + 1)
                mine = to_generate * (p + 1) + (cum[p - 1] if p else 0) + held  # + s * p
                if p:
                    last = min(stop - 1, (limit - mine - 1) // p)  # mine + s * p < limit
                else:
                    last = stop - 1 if mine < limit else first - 1
                if first <= last:
                    return first
            s = stop
        return None

    def _newly_locked(self, req: Request, seen: dict[int, int]) -> int:
        ids = self._memory.cache_ids(req) if self._cache else None
        return 0 if ids is None else self._cache.unlocked_len(req.adapter, ids, req.prefill_len - 1, seen)

    def _fits_worst_case(self, to_generate: int, held: int, taken: int) -> bool:
        pos = bisect_right(self._neg_to_generate, -to_generate)
        need = peak_need(
            [-n for n in self._neg_to_generate[:pos]] + [to_generate] + [-n for n in self._neg_to_generate[pos:]],
            self._held[:pos] + [held] + self._held[pos:],
        )
        return need < self.config.pool_tokens - taken

    def _insert(self, to_generate: int, held: int) -> None:
        pos = bisect_right(self._neg_to_generate, -to_generate)
        self._neg_to_generate.insert(pos, -to_generate)
        self._held.insert(pos, held)
        self._count += 1
