"""Frozen configuration of the engine, its memory pool and its admission check (EngineConfig)."""

from dataclasses import dataclass
from functools import cached_property

from slora_vtc.errors import UserError

DEFAULT_POOL_TOKENS = 10_000  # A10G 24 GB with Llama-7B, as in the paper
MAX_REQ_TOTAL_LEN = 3072  # S-LoRA's default max_req_total_len (2048 + 1024)
ADMISSIONS = ("conservative", "optimistic")  # S-LoRA's worst-case reservation; vLLM's admit-while-free with preemption
BATCHINGS = ("slora", "chunked")  # S-LoRA's separate prefill and decode passes; vLLM's chunked prefill


def flag(field: str) -> str:
    """The command-line option that sets an EngineConfig field (`run`, `replay` and `serve` spell them alike)."""
    return "--" + field.replace("_", "-")


@dataclass(frozen=True)
class EngineConfig:
    """How the continuous-batching loop and its admission check behave (docs/design.md, "The engine loop")."""

    pool_tokens: int = DEFAULT_POOL_TOKENS
    max_wait_steps: int = 10  # decode steps between admission attempts
    max_running: int = 1000  # S-LoRA's running_max_req_size
    lora_rank: int = 8  # every client has a rank-8 adapter in the paper's runs
    batch_max_tokens_override: int | None = None
    adapter_row_slots: int = 1  # slots one adapter row takes (model.spec.ModelSpec.lora_slots_per_row on a real model)
    adapter_sizes: tuple[tuple[str, int], ...] = ()  # (name, slots) of adapters whose size differs from adapter_slots
    prefix_cache: bool = False  # share K/V of common prompt prefixes through a radix tree in the pool
    admission: str = "conservative"  # or "optimistic": admit while slots are free, preempt by recompute when short
    macro_steps: bool = True  # simulator: run decode steps that single steps would run alike at once (same results)
    batching: str = "slora"  # or "chunked": vLLM's token budget per step, prompts prefilled in chunks (chunked.py)
    max_num_batched_tokens: int = 2048  # chunked: tokens one step computes (vLLM's default on a GPU)
    max_num_seqs: int = 256  # chunked: requests running at once (vLLM's default on a GPU)
    block_size: int = 16  # chunked: tokens per KV block, the unit memory is allocated in (vLLM's default)

    def __post_init__(self):
        if self.pool_tokens <= 0:
            raise UserError(f"--pool-tokens must be positive, got {self.pool_tokens}")
        if self.max_wait_steps < 0 or self.max_running <= 0 or self.lora_rank < 0:
            raise UserError("max_wait_steps >= 0, max_running > 0 and lora_rank >= 0 are required")
        if self.admission not in ADMISSIONS:
            raise UserError(f"unknown admission '{self.admission}' (known: {', '.join(ADMISSIONS)})")
        if self.adapter_row_slots < 1:
            raise UserError(f"adapter_row_slots must be at least 1, got {self.adapter_row_slots}")
        self._check_batching()

    def _check_batching(self) -> None:
        if self.batching not in BATCHINGS:
            raise UserError(f"unknown --batching '{self.batching}' (known: {', '.join(BATCHINGS)})")
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size"):
            if getattr(self, name) <= 0:
                raise UserError(f"{flag(name)} must be positive, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.block_size:
            raise UserError(
                f"--max-num-batched-tokens ({self.max_num_batched_tokens}) is smaller than a block "
                f"(--block-size {self.block_size})"
            )
        if self.batching == "chunked" and self.pool_tokens < self.block_size:
            raise UserError(
                f"a pool of {self.pool_tokens} tokens is smaller than a block (--block-size {self.block_size})"
            )

    @property
    def chunked(self) -> bool:
        return self.batching == "chunked"

    def round_up(self, tokens: int) -> int:
        """Chunked batching: the slots `tokens` tokens take in whole blocks of block_size."""
        return -(-tokens // self.block_size) * self.block_size

    @property
    def batch_max_tokens(self) -> int:
        """Prompt tokens one prefill mini-batch may hold: max(pool / 6, 3072) in S-LoRA."""
        if self.batch_max_tokens_override is not None:
            return self.batch_max_tokens_override
        return max(self.pool_tokens // 6, MAX_REQ_TOTAL_LEN)

    @property
    def adapter_slots(self) -> int:
        """Pool slots an adapter not in adapter_sizes takes: rows for q, k, v, o of rank r."""
        return 4 * self.lora_rank * self.adapter_row_slots

    @cached_property
    def _sizes(self) -> dict[str, int]:
        return dict(self.adapter_sizes)

    def slots_of(self, adapter: str | None) -> int:
        """Pool slots the named adapter takes when resident (0 for no adapter)."""
        if adapter is None:
            return 0
        return self._sizes.get(adapter, self.adapter_slots)
