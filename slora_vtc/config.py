"""Frozen configuration: the engine, memory pool and schedulers (EngineConfig) and model shapes (ModelSpec)."""

import math
from dataclasses import dataclass

from slora_vtc.errors import UserError

DEFAULT_POOL_TOKENS = 10_000  # A10G 24 GB with Llama-7B, as in the paper
MAX_REQ_TOTAL_LEN = 3072  # S-LoRA's default max_req_total_len (2048 + 1024)


@dataclass(frozen=True)
class EngineConfig:
    """How the continuous-batching loop and its admission check behave (DESIGN section 2)."""

    pool_tokens: int = DEFAULT_POOL_TOKENS
    max_wait_steps: int = 10  # decode steps between admission attempts
    max_running: int = 1000  # S-LoRA's running_max_req_size
    lora_rank: int = 8  # every client has a rank-8 adapter in the paper's runs
    batch_max_tokens_override: int | None = None
    adapter_row_slots: int = 1  # slots one adapter row takes (ModelSpec.lora_slots_per_row on a real model)

    def __post_init__(self):
        if self.pool_tokens <= 0:
            raise UserError(f"pool_tokens must be positive, got {self.pool_tokens}")
        if self.max_wait_steps < 0 or self.max_running <= 0 or self.lora_rank < 0:
            raise UserError("max_wait_steps >= 0, max_running > 0 and lora_rank >= 0 are required")
        if self.adapter_row_slots < 1:
            raise UserError(f"adapter_row_slots must be at least 1, got {self.adapter_row_slots}")

    @property
    def batch_max_tokens(self) -> int:
        """Prompt tokens one prefill mini-batch may hold: max(pool / 6, 3072) in S-LoRA."""
        if self.batch_max_tokens_override is not None:
            return self.batch_max_tokens_override
        return max(self.pool_tokens // 6, MAX_REQ_TOTAL_LEN)

    @property
    def adapter_slots(self) -> int:
        """Pool slots one resident adapter takes: rows for q, k, v, o of rank r."""
        return 4 * self.lora_rank * self.adapter_row_slots


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a Llama model (no weights): what the real backend and the pool layout need."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0: hidden_size // num_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    max_position: int = 2048
    bos_token_id: int = 1
    eos_token_id: int = 2
    tie_word_embeddings: bool = False

    def __post_init__(self):
        sizes = (self.vocab_size, self.hidden_size, self.intermediate_size, self.num_layers, self.num_heads, self.num_kv_heads)
        if min(sizes) <= 0:
            raise UserError(f"model '{self.name}': every size must be positive")
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"model '{self.name}': {self.num_heads} heads do not split into {self.num_kv_heads} KV-head groups")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise UserError(f"model '{self.name}': hidden size {self.hidden_size} is not a multiple of {self.num_heads} heads")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim % 2:
            raise UserError(f"model '{self.name}': rotary embedding needs an even head_dim, got {self.head_dim}")

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Elements of one pool slot per layer (K or V): kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def lora_slots_per_row(self) -> int:
        """Slots one LoRA row (an A row or a B column, up to max(hidden, q width) long) spans."""
        return math.ceil(max(self.hidden_size, self.q_width) / self.kv_width)

    @property
    def num_params(self) -> int:
        h, q, kv, i = self.hidden_size, self.q_width, self.kv_width, self.intermediate_size
        layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * layer + h + head


MODEL_SPECS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        # small enough for end-to-end runs on a CPU; GQA so that the adapter-row layout is exercised
        ModelSpec("tiny", 256, 64, 128, 2, 4, 2, max_position=4096),
        ModelSpec("llama-7b", 32000, 4096, 11008, 32, 32, 32),
        ModelSpec("llama-2-7b", 32000, 4096, 11008, 32, 32, 32, rms_norm_eps=1e-5, max_position=4096),
        ModelSpec("llama-13b", 32000, 5120, 13824, 40, 40, 40),
    ]
}


def get_model_spec(name: str) -> ModelSpec:
    if name not in MODEL_SPECS:
        raise UserError(f"unknown model '{name}' (known: {', '.join(MODEL_SPECS)}, or a Hugging Face model folder)")
    return MODEL_SPECS[name]
