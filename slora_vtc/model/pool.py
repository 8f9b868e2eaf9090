"""The device side of the unified pool: per layer, K and V buffers of [slots, kv_heads, head_dim].

A slot holds one token's K and V, or a piece of a LoRA adapter row (lora.py); which slot belongs
to whom is decided by the engine's TokenPool, never here.
"""

import torch

from slora_vtc.model.spec import ModelSpec


class KVPool:
    def __init__(self, spec: ModelSpec, num_slots: int, device, dtype: torch.dtype):
        shape = (spec.num_layers, num_slots, spec.num_kv_heads, spec.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]
