"""Plain-torch reference implementations of every kernel (the CPU path and the tests' truth).

Shapes: T tokens in a batch, B requests, Hq query heads, Hk key/value heads (GQA: Hq % Hk == 0),
D head dim, S pool slots. The KV pool of one layer is `k_cache`, `v_cache`: [S, Hk, D].
LoRA adapters live in the same pool: adapter j's rows are pool slots `lora_slots[j]`; for
projection p (0 q, 1 k, 2 v, 3 o) and rank index i, row (p * r + i) holds A_p[i, :] in the K buffer
and B_p[:, i] in the V buffer, each spread over `slots_per_row` consecutive entries of
`lora_slots[j]` when a row is longer than one slot (Hk * D elements, the GQA case).
"""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, H] -> [T, H]; computed in fp32, returned in x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's rotary embedding (rotate-half convention). q: [T, Hq, D], k: [T, Hk, D], positions: [T],
    inv_freq: [D/2] fp32, the model's (possibly scaled) inverse frequencies."""
    d = q.shape[-1]
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(device=q.device, dtype=torch.float32)[None, :]  # [T, D/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def kv_scatter(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write each token's K and V into its pool slot. k, v: [T, Hk, D]; slots: [T] (int64)."""
    k_cache[slots] = k.to(k_cache.dtype)
    v_cache[slots] = v.to(v_cache.dtype)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                      max_seqlen: int | None = None) -> torch.Tensor:
    """Causal attention within each request of a ragged batch (no padding).

    q: [T, Hq, D]; k, v: [T, Hk, D]; cu_seqlens: [B + 1] offsets of each request's tokens.
    max_seqlen: the longest request, if known (the Triton version sizes its grid with it; unused here).
    """
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    for b in range(len(cu_seqlens) - 1):
        s, e = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        qs = q[s:e].float().transpose(0, 1)  # [Hq, L, D]
        ks = k[s:e].float().repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[s:e].float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (qs @ ks.transpose(1, 2)) * scale
        causal = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out[s:e] = (scores.softmax(-1) @ vs).transpose(0, 1).to(q.dtype)
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_table: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One new token per request attends over its cached K/V, read through its slot list.

    q: [B, Hq, D]; slot_table: [B, max_len] (entries past seq_lens[b] are ignored); seq_lens: [B].
    """
    group = q.shape[1] // k_cache.shape[1]
    max_len = slot_table.shape[1]
    valid = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None]  # [B, L]
    # slots past a request's length may hold anything (NaN in a fresh torch.empty pool): zero them
    ignored = ~valid[:, :, None, None]
    k = k_cache[slot_table].float().masked_fill(ignored, 0).repeat_interleave(group, dim=2)  # [B, L, Hq, D]
    v = v_cache[slot_table].float().masked_fill(ignored, 0).repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q.float(), k) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.einsum("bhl,blhd->bhd", scores.softmax(-1), v).to(q.dtype)


def lora_rows(cache: torch.Tensor, lora_slots: torch.Tensor, proj: int, rank: int, length: int) -> torch.Tensor:
    """Rows (p * r .. p * r + r - 1) of every adapter as [A, r, length], gathered from one pool buffer."""
    width = cache.shape[1] * cache.shape[2]
    per_row = lora_slots.shape[1] // (4 * rank)
    slots = lora_slots.view(lora_slots.shape[0], 4 * rank, per_row)[:, proj * rank : (proj + 1) * rank]  # [A, r, per_row]
    rows = cache.reshape(cache.shape[0], width)[slots]  # [A, r, per_row, width]
    return rows.reshape(slots.shape[0], rank, per_row * width)[..., :length]


def lora_shrink(x: torch.Tensor, k_cache: torch.Tensor, lora_slots: torch.Tensor, adapter_ids: torch.Tensor, proj: int, rank: int) -> torch.Tensor:
    """y[t] = A_p(adapter of t) @ x[t]. x: [T, in]; adapter_ids: [T] (-1: no adapter, y = 0) -> [T, r] fp32."""
    a = lora_rows(k_cache, lora_slots, proj, rank, x.shape[1]).float()  # [A, r, in]
    y = torch.zeros(x.shape[0], rank, dtype=torch.float32, device=x.device)
    for adapter in _used_adapters(adapter_ids):
        rows = adapter_ids == adapter
        y[rows] = x[rows].float() @ a[adapter].T
    return y


def lora_expand(y: torch.Tensor, v_cache: torch.Tensor, lora_slots: torch.Tensor, adapter_ids: torch.Tensor, proj: int, rank: int, out: torch.Tensor, scale: float) -> None:
    """out[t] += scale * B_p(adapter of t) @ y[t], in place. y: [T, r]; out: [T, out_dim]."""
    b = lora_rows(v_cache, lora_slots, proj, rank, out.shape[1]).float()  # [A, r, out]
    for adapter in _used_adapters(adapter_ids):
        rows = adapter_ids == adapter
        out[rows] += (scale * (y[rows].float() @ b[adapter])).to(out.dtype)


def _used_adapters(adapter_ids: torch.Tensor) -> list[int]:
    """The adapters some token uses (one matmul each, not a [T, r, dim] gather of weights per token)."""
    return adapter_ids[adapter_ids >= 0].unique().tolist()


def segment_adapter_ids(cu_seqlens: torch.Tensor, segment_adapters: torch.Tensor) -> torch.Tensor:
    """Per-token adapter ids [T] from one adapter per request segment."""
    return segment_adapters.repeat_interleave(cu_seqlens[1:] - cu_seqlens[:-1])


def lora_shrink_segments(x: torch.Tensor, k_cache: torch.Tensor, lora_slots: torch.Tensor, cu_seqlens: torch.Tensor,
                         segment_adapters: torch.Tensor, proj: int, rank: int, max_seqlen: int | None = None) -> torch.Tensor:
    """lora_shrink for a prefill batch: request b's tokens cu_seqlens[b]:cu_seqlens[b + 1] use adapter
    segment_adapters[b] (-1: none). cu_seqlens[-1] == T. max_seqlen as in prefill_attention."""
    return lora_shrink(x, k_cache, lora_slots, segment_adapter_ids(cu_seqlens, segment_adapters), proj, rank)


def lora_expand_segments(y: torch.Tensor, v_cache: torch.Tensor, lora_slots: torch.Tensor, cu_seqlens: torch.Tensor,
                         segment_adapters: torch.Tensor, proj: int, rank: int, out: torch.Tensor, scale: float,
                         max_seqlen: int | None = None) -> None:
    """lora_expand for a prefill batch, one adapter per request segment (see lora_shrink_segments)."""
    lora_expand(y, v_cache, lora_slots, segment_adapter_ids(cu_seqlens, segment_adapters), proj, rank, out, scale)
