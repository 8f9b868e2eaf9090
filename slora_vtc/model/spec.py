"""Which model a name means: a ModelSpec from the table, or one read from a Hugging Face folder.

Torch-free, so that the CLI can check a model argument before anything heavy is imported.
"""

import json
from pathlib import Path

from slora_vtc.config import MODEL_SPECS, ModelSpec, get_model_spec
from slora_vtc.errors import UserError

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
