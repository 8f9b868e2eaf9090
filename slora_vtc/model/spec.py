"""Model shapes (ModelSpec), the table of named specs, and which model a name means: a named
spec or one read from a Hugging Face folder.

Torch-free, so that the CLI can check a model argument before anything heavy is imported.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from slora_vtc.errors import UserError


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


ARCHITECTURE = "LlamaForCausalLM"


def resolve_spec(model: str) -> ModelSpec:
    """A spec name (`tiny`, `llama-7b`, ...) or the path of a Hugging Face model folder."""
    if model in MODEL_SPECS:
        return get_model_spec(model)
    if Path(model).is_dir():
        return spec_from_hf_folder(Path(model))
    return get_model_spec(model)  # the unknown-model error names the known specs


def is_folder(model: str) -> bool:
    return model not in MODEL_SPECS and Path(model).is_dir()


def spec_from_hf_folder(folder: Path) -> ModelSpec:
    path = folder / "config.json"
    if not path.is_file():
        raise UserError(f"{folder}: no config.json (a Hugging Face model folder holds config.json and *.safetensors)")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object")
    architectures = cfg.get("architectures") or [cfg.get("model_type", "unknown")]
    if ARCHITECTURE not in architectures:
        raise UserError(f"{path}: unsupported architecture {', '.join(map(str, architectures))} (only {ARCHITECTURE} is supported)")
    _check_supported(path, cfg)

    def need(key: str):
        if key not in cfg:
            raise UserError(f"{path}: missing '{key}'")
        return cfg[key]

    heads = need("num_attention_heads")
    rope = cfg.get("rope_parameters") or {}
    return ModelSpec(
        name=str(folder),
        vocab_size=need("vocab_size"),
        hidden_size=need("hidden_size"),
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or 0,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10_000.0)),
        max_position=cfg.get("max_position_embeddings", 2048),
        bos_token_id=_first(cfg.get("bos_token_id"), 1),
        eos_token_id=_first(cfg.get("eos_token_id"), 2),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )


def _check_supported(path: Path, cfg: dict) -> None:
    """Llama variants whose math differs from ours are refused rather than run wrongly."""
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise UserError(f"{path}: attention or MLP biases are not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UserError(f"{path}: activation '{cfg['hidden_act']}' is not supported (only silu)")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise UserError(f"{path}: RoPE scaling '{rope_type}' is not supported (only the default rotary embedding)")


def _first(value, default: int) -> int:
    """eos_token_id may be a list in newer configs: the first one stops generation."""
    if isinstance(value, list):
        return value[0] if value else default
    return default if value is None else value
