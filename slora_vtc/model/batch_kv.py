"""A decode batch's K/V laid out densely and kept from step to step (the torch kernels' decode fast path).

The pool keeps each token's K/V in a slot anywhere in it, so the torch decode attention gathers the
batch's whole context out of the pool at every step and layer before attending: on a CPU that copy
took about two thirds of the attention's time (batch 64, context 192; benchmarks/README.md, "Our
serve against vLLM"). While the running batch stays the same (the same requests in the same order,
each one token longer per step), BatchKV keeps that gathered copy, per layer K and V [B, kv_heads,
capacity, head_dim]; a step writes only the new token into it, and attention reads it in place. The pool
stays the truth: a batch that changed (a request joined or left) is gathered afresh from it, as before. The
copy is bounded (at most the pool's size and `max_bytes`); beyond, the gathering path is used.

Float32 attention is two batched matrix products with a softmax between them (`matmuls`), each reading one
contiguous block of `width` rows of a head's K or V: the scores as K q^T (one column per query row), then
the weights times V. For a single query row per request, SDPA's fused CPU kernel took more than twice as
long as reading the K/V takes (benchmarks/README.md, "Our serve against vLLM"), and scores as q K^T over a
transposed K, the layout before this one, longer than K q^T on a batch whose K/V did not fit in the cache
(benchmarks/results/engine_burst.json, `attention_layouts`). Other dtypes, or `matmuls=False`, take SDPA over the
same copy.
"""

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from slora_vtc.model.torch_ops import gather_heads, padding_mask

DENSE_MAX_BYTES = 512 << 20  # the most memory the dense copy may take (K and V, every layer)


@dataclass(frozen=True)
class DenseKV:
    """This step's view of the dense copy: K and V [layers, B, kv_heads, capacity, D]; `refill`: gather the
    whole context from the pool (the batch changed), else write only the new token."""

    k: torch.Tensor
    v: torch.Tensor
    refill: bool
    matmuls: bool = True  # float32: K q^T, softmax, times V; else SDPA

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        new_k: torch.Tensor,
        new_v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_table: torch.Tensor,
        positions: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Decode attention ([B, heads, D] queries), as ops.decode_attention computes it; the new token's K/V are
        already in the pool (`new_k`, `new_v` [B, kv_heads, D] are the same values)."""
        batch, width = slot_table.shape
        k, v = self.k[layer], self.v[layer]
        if self.refill:
            k[:, :, :width] = gather_heads(k_cache, slot_table)
            v[:, :, :width] = gather_heads(v_cache, slot_table)
        else:
            rows = torch.arange(batch, device=q.device)
            k[rows, :, positions] = new_k.to(k.dtype)
            v[rows, :, positions] = new_v.to(v.dtype)
        # query heads sharing a KV head become that head's rows of queries ([B, Hk, group, D]), as in torch_ops
        q = q.unflatten(1, (k.shape[1], -1))
        keys, values, mask = k[:, :, :width], v[:, :, :width], padding_mask(seq_lens, width)
        if not (self.matmuls and q.dtype == torch.float32):
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
            return out.flatten(1, 2)
        scores = torch.matmul(keys, q.transpose(-1, -2)).transpose(-1, -2).mul_(scale)  # [B, Hk, group, width]
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        return torch.matmul(scores.softmax(-1), values).flatten(1, 2)


class BatchKV:
    """The dense copy of the running batch's K/V, and which batch it holds."""

    def __init__(self, k_pool: torch.Tensor, max_bytes: int = DENSE_MAX_BYTES, matmuls: bool = True):
        layers, slots, kv_heads, head_dim = k_pool.shape
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = k_pool.dtype, k_pool.device
        token_bytes = 2 * layers * kv_heads * head_dim * k_pool.element_size()
        self.max_tokens = min(slots, max_bytes // token_bytes)  # batch x capacity
        self._k = self._v = None
        self._rids: list[int] | None = None
        self.matmuls = matmuls

    def view(self, rids: list[int], capacity: int) -> DenseKV | None:
        """The copy for one decode step of these requests (in this order), each holding at most `capacity` tokens
        by its end; None when it would be too large (the caller gathers from the pool)."""
        if len(rids) * capacity > self.max_tokens:
            self.invalidate()
            return None
        refill = rids != self._rids or capacity > self._capacity()
        if refill:
            self._ensure(len(rids), capacity)
            self._rids = rids
        b = len(rids)
        return DenseKV(self._k[:, :b], self._v[:, :b], refill, self.matmuls)

    def invalidate(self) -> None:
        """The next step gathers afresh (the batch's K/V may have changed outside decode steps)."""
        self._rids = None

    def _capacity(self) -> int:
        return self._v.shape[3]  # V [layers, B, kv_heads, capacity, D]

    def _ensure(self, batch: int, capacity: int) -> None:
        if self._v is not None and self._v.shape[1] >= batch and self._capacity() >= capacity:
            return
        rows = max(batch, 0 if self._v is None else self._v.shape[1])
        cols = max(capacity, 0 if self._v is None else self._capacity())
        if rows * cols > self.max_tokens:  # keep within the bound: exactly what this batch needs
            rows, cols = batch, capacity
        self._k = self._v = None  # free the old copy before the new one
        # zeros, not empty: attention weighs padding columns by 0, and 0 x NaN garbage would still be NaN
        new = partial(torch.zeros, dtype=self.dtype, device=self.device)
        shape = (self.layers, rows, self.kv_heads, cols, self.head_dim)
        self._k, self._v = new(shape), new(shape)
