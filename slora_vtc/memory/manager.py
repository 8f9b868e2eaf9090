"""Who holds which slots: each request's KV tokens and each resident LoRA adapter."""

from collections.abc import Callable, Iterable

import numpy as np

from slora_vtc.memory.pool import TokenPool
from slora_vtc.request import Request

AdapterHook = Callable[[str, np.ndarray], None]


class MemoryManager:
    """S-LoRA's unified memory: KV slots and adapter slots come from the same TokenPool.

    Adapters are loaded when a batch that needs them is admitted and evicted once no running
    request uses them. `adapter_slots` is what one adapter takes: a number, or a function of its
    name (EngineConfig.slots_of: adapters of different ranks and targets differ). A real backend
    passes `on_load` to copy the adapter's weights into its slots.
    """

    def __init__(self, pool: TokenPool, adapter_slots: int | Callable[[str], int], on_load: AdapterHook | None = None):
        self.pool = pool
        self.slots_of = adapter_slots if callable(adapter_slots) else (lambda _name: adapter_slots)
        self._on_load = on_load
        self.adapters: dict[str, np.ndarray] = {}

    def admit(self, batch: Iterable[Request]) -> None:
        """Load the batch's adapters and give every request slots for its prompt."""
        for req in batch:
            self._ensure_adapter(req.adapter)
            req.kv_slots.extend(self.pool.alloc(req.prompt_len).tolist())

    def extend(self, running: list[Request]) -> None:
        """One more slot per running request, for the token the next decode step writes."""
        for req, slot in zip(running, self.pool.alloc(len(running)).tolist()):
            req.kv_slots.append(slot)

    def release(self, req: Request) -> None:
        if req.kv_slots:
            self.pool.free(req.kv_slots)
            req.kv_slots = []

    def evict_unused(self, running: Iterable[Request]) -> None:
        in_use = {req.adapter for req in running}
        for name in [a for a in self.adapters if a not in in_use]:
            self.pool.free(self.adapters.pop(name))

    def _ensure_adapter(self, name: str | None) -> None:
        if name is None or name in self.adapters:
            return
        size = self.slots_of(name)
        if size == 0:
            return
        slots = self.pool.alloc(size)
        self.adapters[name] = slots
        if self._on_load is not None:
            self._on_load(name, slots)
