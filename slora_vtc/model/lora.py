"""LoRA adapters and how they sit in the unified pool (the layout of kernels/reference.py).

An adapter of rank r has, per layer and projection p in (q, k, v, o), A_p [r, in] and B_p [out, r];
the projection becomes W x + scale * B_p A_p x. In the pool, row p * r + i holds A_p[i, :] in the K
buffer and B_p[:, i] in the V buffer, each spread over `slots_per_row` slots: 4 r slots_per_row
slots per adapter, allocated by the engine's TokenPool like KV tokens.
"""

import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slora_vtc.model.pool import KVPool
from slora_vtc.model.spec import ModelSpec

B_INIT_STD = 0.02  # dummy adapters: B is not zero (as in training) so that they change the output


@dataclass(frozen=True)
class LoraWeights:
    a: tuple[tuple[torch.Tensor, ...], ...]  # [layer][projection]: [r, in]
    b: tuple[tuple[torch.Tensor, ...], ...]  # [layer][projection]: [out, r]

    @property
    def rank(self) -> int:
        return self.a[0][0].shape[0]


def projection_dims(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(in, out) of the q, k, v and o projections."""
    h, q, kv = spec.hidden_size, spec.q_width, spec.kv_width
    return (h, q), (h, kv), (h, kv), (q, h)


def adapter_slots(spec: ModelSpec, rank: int) -> int:
    return 4 * rank * spec.lora_slots_per_row


def dummy_adapter(spec: ModelSpec, name: str, rank: int, device="cpu", dtype=torch.float32, seed: int = 0) -> LoraWeights:
    """Random weights, the same for the same name and seed on every run."""
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()) + seed)

    def randn(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.empty(rows, cols, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

    dims = projection_dims(spec)
    a = tuple(tuple(randn(rank, i, i**-0.5) for i, _ in dims) for _ in range(spec.num_layers))
    b = tuple(tuple(randn(o, rank, B_INIT_STD) for _, o in dims) for _ in range(spec.num_layers))
    return LoraWeights(a, b)


def write_adapter(pool: KVPool, slots: torch.Tensor, adapter: LoraWeights, spec: ModelSpec) -> None:
    """Copy every layer's A rows into the K buffers and B columns into the V buffers of `slots`."""
    width = spec.lora_slots_per_row * spec.kv_width

    def rows(mats) -> torch.Tensor:  # [layers, 4 r, width], row p * r + i
        return torch.stack([torch.cat([F.pad(m, (0, width - m.shape[1])) for m in layer]) for layer in mats])

    shape = (spec.num_layers, len(slots), spec.num_kv_heads, spec.head_dim)
    pool.k[:, slots] = rows(adapter.a).to(pool.k.dtype).reshape(shape)
    pool.v[:, slots] = rows([[b.T for b in layer] for layer in adapter.b]).to(pool.v.dtype).reshape(shape)
