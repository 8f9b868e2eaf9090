"""Model shapes (ModelSpec), the table of named specs, and which model a name means: a named
spec or one read from a Hugging Face folder.

Torch-free, so that the CLI can check a model argument before anything heavy is imported.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from slora_vtc.errors import UserError

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """How the rotary frequencies are scaled (slora_vtc/model/rope.py computes them).

    `default`: not at all; `linear`: every frequency divided by `factor`; `llama3` (Llama 3.1):
    long wavelengths divided by `factor`, short ones kept, the band between interpolated.
    """

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a Llama-family model (no weights): what the real backend and the pool layout need."""

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
    rope_scaling: RopeScaling = RopeScaling()
    max_position: int = 2048
    bos_token_id: int = 1
    eos_token_ids: tuple[int, ...] = (2,)  # generation stops at any of them
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: a bias on the q, k and v projections

    def __post_init__(self):
        sizes = (
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_layers,
            self.num_heads,
            self.num_kv_heads,
        )
        if min(sizes) <= 0:
            raise UserError(f"model '{self.name}': every size must be positive")
        if self.num_heads % self.num_kv_heads:
            raise UserError(
                f"model '{self.name}': {self.num_heads} heads do not split into {self.num_kv_heads} KV-head groups"
            )
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise UserError(
                    f"model '{self.name}': hidden size {self.hidden_size} is not a multiple of {self.num_heads} heads"
                )
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
        layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h + (q + 2 * kv if self.qkv_bias else 0)
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


ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}  # -> model_type


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
    cfg = Config(path, read_json_object(path))
    family = _family(cfg)
    _check_supported(cfg, family)
    heads = cfg.int("num_attention_heads")
    theta, scaling = _rope(cfg)
    return ModelSpec(
        name=str(folder),
        vocab_size=cfg.int("vocab_size"),
        hidden_size=cfg.int("hidden_size"),
        intermediate_size=cfg.int("intermediate_size"),
        num_layers=cfg.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=cfg.int("num_key_value_heads", heads),
        head_dim=cfg.int("head_dim", 0),
        rms_norm_eps=cfg.float("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position=cfg.int("max_position_embeddings", 2048),
        bos_token_id=_token_ids(cfg, "bos_token_id", (1,))[0],
        eos_token_ids=_eos_token_ids(folder, cfg),
        tie_word_embeddings=cfg.bool("tie_word_embeddings", False),
        qkv_bias=family == "qwen2",
    )


class Config:
    """A config file's fields, each read with the type transformers expects (null: the default)."""

    def __init__(self, path: Path, fields: dict, prefix: str = ""):
        self.path, self.fields, self.prefix = path, fields, prefix

    def get(self, key: str, default=None):
        value = self.fields.get(key)
        return default if value is None else value

    def int(self, key: str, default=None) -> int:
        return self._typed(key, default, "an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))

    def float(self, key: str, default=None) -> float:
        return float(
            self._typed(
                key,
                default,
                "a number",
                lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
            )
        )

    def bool(self, key: str, default=None) -> bool:
        return self._typed(key, default, "true or false", lambda v: isinstance(v, bool))

    def str(self, key: str, default=None) -> str:
        return self._typed(key, default, "a string", lambda v: isinstance(v, str))

    def dict(self, key: str) -> "Config":
        value = self._typed(key, {}, "an object", lambda v: isinstance(v, dict))
        return Config(self.path, value, f"{self.prefix}{key}.")

    def fail(self, key: str, message: str) -> UserError:
        return UserError(f"{self.path}: '{self.prefix}{key}' {message}")

    def _typed(self, key: str, default, expected: str, ok):
        value = self.get(key, default)
        if value is None:
            raise self.fail(key, "is missing")
        if not ok(value):
            raise self.fail(key, f"must be {expected}, got {json.dumps(value)}")
        return value


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object; anything else is one UserError line naming the file."""
    try:
        fields = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(fields, dict):
        raise UserError(f"{path}: expected a JSON object")
    return fields


def _family(cfg: Config) -> str:
    """The model_type of the first supported architecture (or of `model_type` when none is listed)."""
    architectures = cfg.get("architectures", [])
    if not isinstance(architectures, list):
        raise cfg.fail("architectures", f"must be a list of names, got {json.dumps(architectures)}")
    if not architectures:
        model_type = cfg.str("model_type", "unknown")
        if model_type not in ARCHITECTURES.values():
            raise cfg.fail(
                "model_type", f"'{model_type}' is not supported (supported: {', '.join(ARCHITECTURES.values())})"
            )
        return model_type
    known = [ARCHITECTURES[a] for a in architectures if a in ARCHITECTURES]
    if not known:
        raise UserError(
            f"{cfg.path}: unsupported architecture {', '.join(map(str, architectures))} "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    return known[0]


def _check_supported(cfg: Config, family: str) -> None:
    """Variants whose math differs from ours are refused, naming the field, rather than run wrongly."""
    if cfg.str("hidden_act", "silu") != "silu":
        raise cfg.fail("hidden_act", f"'{cfg.get('hidden_act')}' is not supported (only silu)")
    if cfg.bool("mlp_bias", False):
        raise cfg.fail("mlp_bias", "is true: MLP biases are not supported")
    if family != "qwen2" and cfg.bool("attention_bias", False):
        raise cfg.fail("attention_bias", "is true: attention biases are supported only as Qwen2 has them (q, k, v)")
    _check_sliding_window(cfg, family)


def _check_sliding_window(cfg: Config, family: str) -> None:
    """Full attention is what we run; a sliding window as long as the context changes nothing."""
    layer_types = cfg.get("layer_types", [])
    if not isinstance(layer_types, list) or not set(layer_types) <= {"full_attention", "sliding_attention"}:
        raise cfg.fail(
            "layer_types", f"{json.dumps(layer_types)} is not supported (only full_attention and sliding_attention)"
        )
    used = cfg.bool("use_sliding_window", False) if family == "qwen2" else True
    window = cfg.int("sliding_window", 0) if used else 0
    context = cfg.int("max_position_embeddings", 2048)
    if 0 < window < context:
        raise cfg.fail(
            "sliding_window",
            f"is {window}, below max_position_embeddings {context}: sliding-window attention is not supported",
        )


def _rope(cfg: Config) -> tuple[float, RopeScaling]:
    """rope_theta and the scaling, from `rope_parameters` (transformers 5) or `rope_scaling` + `rope_theta` (4);
    as transformers does, `rope_scaling` wins when both are there, and a top-level field fills in a missing one."""
    key = "rope_scaling" if cfg.get("rope_scaling") is not None else "rope_parameters"
    rope = cfg.dict(key)
    theta = rope.float("rope_theta", cfg.float("rope_theta", 10_000.0))
    kind = rope.str("rope_type", rope.str("type", "default"))
    if kind not in ROPE_TYPES:
        raise rope.fail("rope_type", f"'{kind}' is not supported (supported: {', '.join(ROPE_TYPES)})")
    if rope.float("partial_rotary_factor", cfg.float("partial_rotary_factor", 1.0)) != 1.0:
        raise rope.fail("partial_rotary_factor", "other than 1 is not supported")
    if kind == "default":
        return theta, RopeScaling()
    factor = rope.float("factor")
    if factor <= 0:
        raise rope.fail("factor", f"must be positive, got {factor}")
    if kind == "linear":
        return theta, RopeScaling("linear", factor)
    low, high = rope.float("low_freq_factor"), rope.float("high_freq_factor")
    if not 0 < low < high:
        raise rope.fail("high_freq_factor", f"must exceed low_freq_factor ({low}), both positive; got {high}")
    original = rope.int("original_max_position_embeddings", cfg.int("max_position_embeddings", 2048))
    return theta, RopeScaling("llama3", factor, low, high, original)


def _token_ids(cfg: Config, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A token id field: one id or a list of them."""
    value = cfg.get(key, list(default))
    ids = value if isinstance(value, list) else [value]
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise cfg.fail(key, f"must be a token id or a list of them, got {json.dumps(value)}")
    return tuple(ids)


def _eos_token_ids(folder: Path, cfg: Config) -> tuple[int, ...]:
    """config.json's EOS ids, then those generation_config.json adds: a chat model often lists its
    end-of-turn token only there, and a token either file calls EOS ends generation."""
    ids = _token_ids(cfg, "eos_token_id", (2,))
    path = folder / "generation_config.json"
    if path.is_file():
        generation = Config(path, read_json_object(path))
        ids += _token_ids(generation, "eos_token_id", ()) if generation.get("eos_token_id") is not None else ()
    return tuple(dict.fromkeys(ids))
