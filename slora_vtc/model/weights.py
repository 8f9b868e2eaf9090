"""Model weights: random (seeded) from a ModelSpec, or read from a Hugging Face folder (safetensors).

q/k/v and gate/up are stored stacked, so a layer runs two input matmuls instead of five.
Hugging Face's Llama, Mistral and Qwen2 use the same rotate-half rotary convention as ours: no
permutation needed.
"""

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from slora_vtc.errors import UserError
from slora_vtc.model.spec import ModelSpec, is_folder

INIT_STD = 0.02  # as Hugging Face initializes Llama


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    wqkv: torch.Tensor  # [q + 2 kv, H]
    wo: torch.Tensor  # [H, q]
    mlp_norm: torch.Tensor  # [H]
    w_gate_up: torch.Tensor  # [2 I, H]
    w_down: torch.Tensor  # [H, I]
    bqkv: torch.Tensor | None = None  # [q + 2 kv]: Qwen2's q/k/v bias


@dataclass(frozen=True)
class LlamaWeights:
    embed: torch.Tensor  # [V, H]
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]


def load_weights(
    model: str, spec: ModelSpec, device: str | torch.device, dtype: torch.dtype, seed: int = 0
) -> LlamaWeights:
    """A Hugging Face folder's weights, or dummy weights when `model` names a spec."""
    if is_folder(model):
        return hf_weights(Path(model), spec, device, dtype)
    return dummy_weights(spec, device, dtype, seed)


def dummy_weights(spec: ModelSpec, device="cpu", dtype=torch.float32, seed: int = 0) -> LlamaWeights:
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, INIT_STD, generator=gen)

    def ones() -> torch.Tensor:
        return torch.ones(spec.hidden_size, device=device, dtype=dtype)

    h, q, kv, i = spec.hidden_size, spec.q_width, spec.kv_width, spec.intermediate_size
    layers = tuple(
        LayerWeights(
            ones(),
            randn(q + 2 * kv, h),
            randn(h, q),
            ones(),
            randn(2 * i, h),
            randn(h, i),
            randn(q + 2 * kv) if spec.qkv_bias else None,
        )
        for _ in range(spec.num_layers)
    )
    embed = randn(spec.vocab_size, h)
    return LlamaWeights(embed, layers, ones(), embed if spec.tie_word_embeddings else randn(spec.vocab_size, h))


def hf_weights(folder: Path, spec: ModelSpec, device, dtype: torch.dtype) -> LlamaWeights:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"{folder}: no *.safetensors files (only safetensors weights are read)")
    with ExitStack() as stack:
        where: dict[str, tuple[Path, object]] = {}  # tensor name -> (its file, the open file)
        for file in files:
            handle = stack.enter_context(_open(file))
            where.update({name: (file, handle) for name in handle.keys()})

        def get(name: str, *shape: int) -> torch.Tensor:
            if name not in where:
                raise UserError(f"{folder}: tensor '{name}' is missing")
            file, handle = where[name]
            with _unreadable_is_user_error(file):
                tensor = handle.get_tensor(name)
            if tuple(tensor.shape) != shape:
                raise UserError(f"{folder}: tensor '{name}' has shape {tuple(tensor.shape)}, expected {shape}")
            return tensor.to(device=device, dtype=dtype)

        h, q, kv, i, v = spec.hidden_size, spec.q_width, spec.kv_width, spec.intermediate_size, spec.vocab_size

        def layer(n: int) -> LayerWeights:
            p = f"model.layers.{n}."
            attn, mlp = p + "self_attn.", p + "mlp."
            return LayerWeights(
                attn_norm=get(p + "input_layernorm.weight", h),
                wqkv=torch.cat(
                    [
                        get(attn + "q_proj.weight", q, h),
                        get(attn + "k_proj.weight", kv, h),
                        get(attn + "v_proj.weight", kv, h),
                    ]
                ),
                bqkv=torch.cat(
                    [get(attn + "q_proj.bias", q), get(attn + "k_proj.bias", kv), get(attn + "v_proj.bias", kv)]
                )
                if spec.qkv_bias
                else None,
                wo=get(attn + "o_proj.weight", h, q),
                mlp_norm=get(p + "post_attention_layernorm.weight", h),
                w_gate_up=torch.cat([get(mlp + "gate_proj.weight", i, h), get(mlp + "up_proj.weight", i, h)]),
                w_down=get(mlp + "down_proj.weight", h, i),
            )

        embed = get("model.embed_tokens.weight", v, h)
        return LlamaWeights(
            embed=embed,
            layers=tuple(layer(n) for n in range(spec.num_layers)),
            norm=get("model.norm.weight", h),
            lm_head=embed
            if spec.tie_word_embeddings
            else get("lm_head.weight", v, h),  # tied: a stored lm_head is ignored
        )


@contextmanager
def _unreadable_is_user_error(file: Path):
    try:
        yield
    except (SafetensorError, OSError) as e:
        raise UserError(f"{file}: not a readable safetensors file, truncated or corrupt? ({e})") from None


@contextmanager
def _open(file: Path):
    with _unreadable_is_user_error(file):
        handle = safe_open(str(file), framework="pt", device="cpu")
    with handle as opened:
        yield opened
