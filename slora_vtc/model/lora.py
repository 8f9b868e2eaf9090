"""LoRA adapter weights: read from a PEFT folder or made up (dummy), and written into the unified pool.

An adapter of rank r changes each module it targets from W x to W x + scale * B A x, with
A [r, in] and B [out, r] per layer. Where its rows go in the pool is AdapterSpec.layout
(model/adapters.py); the LoRA kernels read them from there (kernels/reference.py, LoraRows).
"""

import re
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open

from slora_vtc.errors import UserError
from slora_vtc.model.adapters import WEIGHTS_FILE, AdapterSpec, module_dims
from slora_vtc.model.pool import KVPool
from slora_vtc.model.spec import ModelSpec

B_INIT_STD = 0.02  # dummy adapters: B is not zero (as in training) so that they change the output
PEFT_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


@dataclass(frozen=True)
class LoraWeights:
    spec: AdapterSpec
    a: dict[str, tuple[torch.Tensor, ...]]  # target -> per layer [r, in]
    b: dict[str, tuple[torch.Tensor, ...]]  # target -> per layer [out, r]


def dummy_adapter(
    model: ModelSpec, adapter: AdapterSpec, device="cpu", dtype=torch.float32, seed: int = 0
) -> LoraWeights:
    """Random weights, the same for the same name and seed on every run."""
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(adapter.name.encode()) + seed)

    def randn(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.empty(rows, cols, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

    dims, r = module_dims(model), adapter.rank
    a = {t: tuple(randn(r, dims[t][0], dims[t][0] ** -0.5) for _ in range(model.num_layers)) for t in adapter.targets}
    b = {t: tuple(randn(dims[t][1], r, B_INIT_STD) for _ in range(model.num_layers)) for t in adapter.targets}
    return LoraWeights(adapter, a, b)


def peft_adapter(model: ModelSpec, adapter: AdapterSpec, dtype=torch.float32) -> LoraWeights:
    """The weights of a PEFT folder (on the CPU), checked against the base model's shapes."""
    path = f"{adapter.path}/{WEIGHTS_FILE}"
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, SafetensorError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e})") from None
    found: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = PEFT_KEY.search(key)
        if m is None:
            raise UserError(f"{path}: tensor '{key}' is not a LoRA A or B weight of a supported module")
        layer, target, ab = int(m[1]), m[2], m[3]
        found.setdefault((target, ab), {})[layer] = tensor
    dims, r = module_dims(model), adapter.rank

    def per_layer(target: str, ab: str) -> tuple[torch.Tensor, ...]:
        layers = found.get((target, ab), {})
        shape = (r, dims[target][0]) if ab == "A" else (dims[target][1], r)
        out = []
        for n in range(model.num_layers):
            if n not in layers:
                raise UserError(
                    f"{path}: no lora_{ab} weight for layer {n}'s {target} "
                    f"(the base model has {model.num_layers} layers)"
                )
            if tuple(layers[n].shape) != shape:
                raise UserError(
                    f"{path}: layer {n} {target}.lora_{ab} has shape {tuple(layers[n].shape)}, "
                    f"the base model needs {shape} (an adapter for another model?)"
                )
            out.append(layers[n].to(dtype))
        return tuple(out)

    extra = sorted({t for t, _ in found} - set(adapter.targets))
    if extra:
        raise UserError(f"{path}: weights for '{extra[0]}', which adapter_config.json's target_modules does not list")
    return LoraWeights(
        adapter, {t: per_layer(t, "A") for t in adapter.targets}, {t: per_layer(t, "B") for t in adapter.targets}
    )


def _slot_rows(mats, per_row: int, width: int) -> torch.Tensor:
    """Per layer an [r, n] matrix, each row zero-padded to per_row slots of `width`: [layers, r * per_row, width]."""
    return torch.stack([F.pad(m, (0, per_row * width - m.shape[1])).reshape(len(m) * per_row, width) for m in mats])


def write_adapter(pool: KVPool, slots: torch.Tensor, weights: LoraWeights, model: ModelSpec) -> None:
    """Copy every layer's A rows into the K buffers and B columns into the V buffers of the adapter's slots."""
    width, r = model.kv_width, weights.spec.rank
    for target, (start, per_row) in weights.spec.layout(model).items():
        mine = slots[start : start + r * per_row]
        shape = (model.num_layers, len(mine), model.num_kv_heads, model.head_dim)
        a_rows = _slot_rows(weights.a[target], per_row, width)
        pool.k[:, mine] = a_rows.to(device=pool.k.device, dtype=pool.k.dtype).reshape(shape)
        b_rows = _slot_rows([b.T for b in weights.b[target]], per_row, width)
        pool.v[:, mine] = b_rows.to(device=pool.v.device, dtype=pool.v.dtype).reshape(shape)
