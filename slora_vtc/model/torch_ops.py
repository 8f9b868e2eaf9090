"""The kernel set of `--backend torch`: the reference ops' signatures, in fewer and fused torch calls.

kernels/reference.py is written to be obviously right (the tests' ground truth); on a CPU its
Python-level op count dominates a small model's step. Here: RMSNorm in three passes, the rotary
tables computed once per forward (not per layer) and applied in place, and scaled_dot_product_attention
(GQA without copying K/V per query head) for the attention ops (prefill, extend over a cached prefix,
decode). LoRA uses the references as they are. tests/real/test_model.py checks every op against the
reference.
"""

import torch
import torch.nn.functional as F

from slora_vtc_kernels import reference

# Gathered K + V per SDPA call in decode_attention: small enough to stay in the CPU's cache and under
# malloc's mmap threshold (a larger buffer is mapped and page-faulted afresh on every call: ~3x slower
# at batch 64, context 1,024).
DECODE_CHUNK_BYTES = 4 << 20


class TorchOps:
    name = "torch"
    gathers_decode_kv = True  # decode_attention copies the context out of the pool: a backend may keep it (batch_kv.py)
    lora_shrink = staticmethod(reference.lora_shrink)
    lora_expand = staticmethod(reference.lora_expand)
    lora_shrink_segments = staticmethod(reference.lora_shrink_segments)
    lora_expand_segments = staticmethod(reference.lora_expand_segments)

    def __init__(self):
        self._halves_of: torch.Tensor | None = (
            None  # the inv_freq last seen (a model passes the same tensor every step)
        )
        self._both_halves: torch.Tensor | None = None  # it, repeated for both halves of a head: [D]
        # the positions last rotated (a model passes the same tensor to every layer of a forward) and their
        # rotation: cos and the signed sin ([T, 1, D], fp32), computed once per forward instead of once per layer
        self._rotation_of: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rotation: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x / sqrt(mean(x^2) + eps) * weight in fp32: F.rms_norm's numbers to the bit, but F.rms_norm on a CPU
        took 15x as long on a prefill of 5,120 tokens (hidden 256), and as long at 64 (a decode)."""
        x32 = x.float()
        scale = x32.square().mean(-1, keepdim=True).add_(eps).rsqrt_()
        return (x32 * scale).mul_(weight.float()).to(x.dtype)

    def rotary_embedding(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, signed_sin = self._rotation_for(positions, inv_freq, q.device)
        return _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)

    def _rotation_for(
        self, positions: torch.Tensor, inv_freq: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = self._rotation_of
        if key is None or key[0] is not positions or key[1] is not inv_freq:
            angles = positions.float()[:, None, None] * self._frequencies(inv_freq, device)  # [T, 1, D]
            cos, sin = angles.cos(), angles.sin()
            half = sin.shape[-1] // 2
            sin[..., :half].neg_()  # rotate-half's sign: x * cos + [-x2, x1] * sin = x * cos + [x2, x1] * signed sin
            self._rotation_of, self._rotation = (positions, inv_freq), (cos, sin)
        return self._rotation

    def _frequencies(self, inv_freq: torch.Tensor, device: torch.device) -> torch.Tensor:
        if inv_freq is not self._halves_of:
            halves = inv_freq.to(device=device, dtype=torch.float32)
            self._halves_of, self._both_halves = inv_freq, torch.cat([halves, halves])
        return self._both_halves

    @staticmethod
    def kv_scatter(
        k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None:
        k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.index_copy_(0, slots, v.to(v_cache.dtype))

    @staticmethod
    def prefill_attention(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: torch.Tensor,
        scale: float,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        bounds = cu_seqlens.tolist()
        lengths = {e - s for s, e in zip(bounds[:-1], bounds[1:])}
        if len(lengths) == 1:  # prompts of one length: a single call over [prompts, tokens, heads, dim]
            shape = (len(bounds) - 1, lengths.pop())
            return _causal_attention(
                q.unflatten(0, shape), k.unflatten(0, shape), v.unflatten(0, shape), scale
            ).flatten(0, 1)
        out = torch.empty_like(q)
        for s, e in zip(bounds[:-1], bounds[1:]):
            out[s:e] = _causal_attention(q[None, s:e], k[None, s:e], v[None, s:e], scale)[0]
        return out

    @staticmethod
    def extend_attention(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cu_seqlens: torch.Tensor,
        slot_table: torch.Tensor,
        cached_lens: torch.Tensor,
        scale: float,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        """Per request: gather its context's K/V from the pool, one SDPA call whose mask is causal shifted by
        its cached length (query j sits at position cached + j)."""
        bounds, cached = cu_seqlens.tolist(), cached_lens.tolist()
        out = torch.empty_like(q)
        for b, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
            slots = slot_table[b, : cached[b] + e - s]
            k = k_cache.index_select(0, slots).transpose(0, 1)[None]  # [1, Hk, C, D]
            v = v_cache.index_select(0, slots).transpose(0, 1)[None]
            visible = (
                torch.arange(len(slots), device=q.device)
                <= torch.arange(cached[b], cached[b] + e - s, device=q.device)[:, None]
            )
            out[s:e] = F.scaled_dot_product_attention(
                q[None, s:e].transpose(1, 2), k, v, attn_mask=visible, scale=scale, enable_gqa=True
            )[0].transpose(0, 1)
        return out

    @staticmethod
    def decode_attention(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_table: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        batch, width = slot_table.shape
        rows = max(1, DECODE_CHUNK_BYTES // (2 * width * k_cache[0].numel() * k_cache.element_size()))
        if rows >= batch:
            return _decode_rows(q, k_cache, v_cache, slot_table, seq_lens, scale)
        out = torch.empty_like(q)
        for s in range(0, batch, rows):
            out[s : s + rows] = _decode_rows(
                q[s : s + rows], k_cache, v_cache, slot_table[s : s + rows], seq_lens[s : s + rows], scale
            )
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of [T, H, D] with [T, 1, D] tables, in fp32: two new tensors and in-place ops (each pass over
    a prefill's activations costs as much as a projection on a CPU); the same numbers to the bit as
    x * cos + cat(-x2, x1) * sin."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    out = x32 * cos
    return out.add_(torch.cat([x2, x1], dim=-1).mul_(signed_sin)).to(x.dtype)


def _decode_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """decode_attention for a few requests: gather their K/V ([B, L, Hk, D]), one SDPA call."""
    if (
        seq_lens.device.type == "cpu"
    ):  # trim the table to these requests' longest (on a GPU reading the lengths would sync)
        table = table[:, : int(seq_lens.max())]
    width, kv_heads = table.shape[1], k_cache.shape[1]
    k, v = gather_heads(k_cache, table), gather_heads(v_cache, table)
    # The query heads that share a KV head become that head's rows of queries ([B, Hk, group, D]), so
    # SDPA reads each K/V head once instead of once per query head: ~1.3x faster than enable_gqa at batch 64.
    out = F.scaled_dot_product_attention(
        q.unflatten(1, (kv_heads, -1)), k, v, attn_mask=padding_mask(seq_lens, width), scale=scale
    )
    return out.flatten(1, 2)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """[N, T, H, D] queries over [N, T, Hk, D] keys/values, causal. SDPA takes its fused CPU kernel only for
    4-D inputs ([N, H, T, D]); 3-D ones go to the math path (~4x slower at 1,000 tokens)."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2)


def gather_heads(cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The K or V of the slots of `table` [B, L], out of a pool [slots, Hk, D], as [B, Hk, L, D]."""
    shape = (*table.shape, *cache.shape[1:])
    return cache.index_select(0, table.flatten()).view(shape).transpose(1, 2)  # index_select: ~5x faster than []


def padding_mask(seq_lens: torch.Tensor, width: int) -> torch.Tensor | None:
    """[B, 1, 1, L]: which table columns hold a token; None when every request fills the table (on a GPU the check
    would cost a sync, so there the mask is always built)."""
    if seq_lens.device.type == "cpu" and bool((seq_lens == width).all()):
        return None
    valid = torch.arange(width, device=seq_lens.device) < seq_lens[:, None]
    return valid[:, None, None, :]
