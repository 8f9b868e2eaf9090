"""The unified token pool (KV cache and LoRA adapters share its slots) and the admission check."""

from slora_vtc.memory.admission import Budget, fits_alone
from slora_vtc.memory.manager import MemoryManager
from slora_vtc.memory.pool import CountingPool, PoolExhausted, TokenPool

__all__ = ["Budget", "CountingPool", "MemoryManager", "PoolExhausted", "TokenPool", "fits_alone"]
