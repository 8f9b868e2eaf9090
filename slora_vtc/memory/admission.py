"""The admission check every scheduler shares (S-LoRA's router; docs/design.md, "The memory pool and the admission check").

Each request is a pair (tokens held now, tokens still to generate). Sorted by tokens to generate,
descending, the pool must hold max_i(to_generate[i] * (i + 1) + cumulative_held[i]) tokens at
the worst future moment; a batch is admitted only if that is below the pool minus adapter slots.
"""

from bisect import bisect_right
from itertools import accumulate

from slora_vtc.config import EngineConfig
from slora_vtc.request import Request


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
    everything admitted so far and, if so, counts it in.
    """

    def __init__(self, config: EngineConfig, running: list[Request]):
        self.config = config
        self._neg_to_generate: list[int] = []  # ascending, i.e. to_generate descending
        self._held: list[int] = []
        self._adapters = {r.adapter for r in running if r.adapter is not None}
        self._adapter_slots = sum(config.slots_of(a) for a in self._adapters)  # resident + admitted this round, each at its size
        self._count = 0
        self._prompt_tokens = 0
        for req in running:
            self._insert(req.remaining, req.held_tokens)

    def try_add(self, req: Request) -> bool:
        if self._count + 1 > self.config.max_running:
            return False
        if self._prompt_tokens + req.prompt_len > self.config.batch_max_tokens:
            return False
        new_adapter = req.adapter is not None and req.adapter not in self._adapters
        adapter_slots = self._adapter_slots + (self.config.slots_of(req.adapter) if new_adapter else 0)
        to_generate, held = req.max_new_tokens - 1, req.prompt_len + 1
        pos = bisect_right(self._neg_to_generate, -to_generate)
        need = peak_need(
            [-n for n in self._neg_to_generate[:pos]] + [to_generate] + [-n for n in self._neg_to_generate[pos:]],
            self._held[:pos] + [held] + self._held[pos:],
        )
        if need >= self.config.pool_tokens - adapter_slots:
            return False
        self._neg_to_generate.insert(pos, -to_generate)
        self._held.insert(pos, held)
        self._count += 1
        self._prompt_tokens += req.prompt_len
        if new_adapter:
            self._adapters.add(req.adapter)
            self._adapter_slots = adapter_slots
        return True

    def _insert(self, to_generate: int, held: int) -> None:
        pos = bisect_right(self._neg_to_generate, -to_generate)
        self._neg_to_generate.insert(pos, -to_generate)
        self._held.insert(pos, held)
        self._count += 1
