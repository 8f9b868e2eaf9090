"""Plain-torch reference implementations of every kernel (the CPU path and the tests' truth).

Shapes: T tokens in a batch, B requests, Hq query heads, Hk key/value heads (GQA: Hq % Hk == 0),
D head dim, S pool slots. The KV pool of one layer is `k_cache`, `v_cache`: [S, Hk, D].
LoRA adapters live in the same pool: a LoRA op works on one projection (q, k, v, o, gate, up or
down) at a time, and `LoraRows` says where each resident adapter's rows for it lie. Row i holds
A[i, :] in the K buffer and B[:, i] in the V buffer, spread over `per_row` slots when a row is
longer than one slot (Hk * D elements). Adapters of different ranks mix in one batch.
"""

from dataclasses import dataclass

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, H] -> [T, H]; computed in fp32, returned in x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's rotary embedding (rotate-half convention). q: [T, Hq, D], k: [T, Hk, D], positions: [T],
    inv_freq: [D/2] fp32, the model's (possibly scaled) inverse frequencies."""
    d = q.shape[-1]
    angles = (
        positions.to(torch.float32)[:, None] * inv_freq.to(device=q.device, dtype=torch.float32)[None, :]
    )  # [T, D/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def kv_scatter(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Write each token's K and V into its pool slot. k, v: [T, Hk, D]; slots: [T] (int64)."""
    k_cache[slots] = k.to(k_cache.dtype)
    v_cache[slots] = v.to(v_cache.dtype)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    max_seqlen: int | None = None,
) -> torch.Tensor:
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
    """Prefill of requests whose first tokens already have K/V in the pool (a prefix-cache hit, or none).

    Request b computes only its new tokens cu_seqlens[b]:cu_seqlens[b + 1] (q: [T, Hq, D]), at positions
    cached_lens[b] + 0, 1, ...; their K/V are already in the pool. Each attends causally over the request's
    whole context, read through slot_table[b, : cached_lens[b] + new_b] ([B, max_ctx]; later entries ignored).
    """
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    for b in range(len(cu_seqlens) - 1):
        s, e, cached = int(cu_seqlens[b]), int(cu_seqlens[b + 1]), int(cached_lens[b])
        slots = slot_table[b, : cached + e - s]
        qs = q[s:e].float().transpose(0, 1)  # [Hq, L, D]
        ks = k_cache[slots].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, C, D]
        vs = v_cache[slots].float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (qs @ ks.transpose(1, 2)) * scale
        query_pos = cached + torch.arange(e - s, device=q.device)
        visible = torch.arange(len(slots), device=q.device)[None, :] <= query_pos[:, None]  # [L, C]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[s:e] = (scores.softmax(-1) @ vs).transpose(0, 1).to(q.dtype)
    return out


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
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


@dataclass(frozen=True)
class LoraRows:
    """Where one projection's LoRA rows lie in the pool, for every resident adapter.

    Row i (0 <= i < ranks[j]) of adapter j takes the pool slots
    slots[j, starts[j] + i * per_row : starts[j] + (i + 1) * per_row]; concatenated, those slots
    hold A[i, :] (in_dim long) in the K buffer and B[:, i] (out_dim long) in the V buffer.
    An adapter that does not adapt this projection has rank 0 (its start is then unused).
    """

    slots: torch.Tensor  # [A, L] int64: each adapter's pool slots (rows padded to the longest adapter)
    starts: torch.Tensor  # [A] int64: index in slots[j] of this projection's first row
    ranks: torch.Tensor  # [A] int64: this projection's rank for each adapter, 0 when not adapted
    scales: torch.Tensor  # [A] float32: each adapter's lora_alpha / r (or / sqrt(r), rsLoRA)
    max_rank: int  # max(ranks), known on the host so that kernels size their blocks without a sync
    per_row: int  # slots one row spans: ceil(max(in_dim, out_dim) / slot width)


def lora_rows(cache: torch.Tensor, rows: LoraRows, length: int) -> torch.Tensor:
    """Every adapter's rows as [A, max_rank, length] from one pool buffer; rows past an adapter's rank are 0."""
    width = cache.shape[1] * cache.shape[2]
    i = torch.arange(rows.max_rank, device=rows.slots.device)
    index = (
        rows.starts[:, None, None] + i[None, :, None] * rows.per_row + torch.arange(rows.per_row, device=i.device)
    )  # [A, r, per_row]
    valid = i[None, :] < rows.ranks[:, None]  # [A, r]
    slots = rows.slots.gather(1, index.clamp(0, rows.slots.shape[1] - 1).flatten(1)).view(index.shape)
    gathered = cache.reshape(cache.shape[0], width)[slots].reshape(*slots.shape[:2], rows.per_row * width)[..., :length]
    return gathered.masked_fill(~valid[..., None], 0)  # not a product: slots past a rank may hold NaN or inf


def lora_shrink(x: torch.Tensor, k_cache: torch.Tensor, rows: LoraRows, adapter_ids: torch.Tensor) -> torch.Tensor:
    """y[t] = A(adapter of t) @ x[t]. x: [T, in]; adapter_ids: [T] (-1: no adapter, y = 0) -> [T, max_rank] fp32."""
    a = lora_rows(k_cache, rows, x.shape[1]).float()  # [A, r, in]
    y = torch.zeros(x.shape[0], rows.max_rank, dtype=torch.float32, device=x.device)
    for adapter in _used_adapters(adapter_ids):
        mine = adapter_ids == adapter
        y[mine] = x[mine].float() @ a[adapter].T
    return y


def lora_expand(
    y: torch.Tensor, v_cache: torch.Tensor, rows: LoraRows, adapter_ids: torch.Tensor, out: torch.Tensor
) -> None:
    """out[t] += scale(adapter of t) * B(adapter of t) @ y[t], in place. y: [T, max_rank]; out: [T, out_dim]."""
    b = lora_rows(v_cache, rows, out.shape[1]).float()  # [A, r, out]
    for adapter in _used_adapters(adapter_ids):
        mine = adapter_ids == adapter
        out[mine] += (rows.scales[adapter].float() * (y[mine].float() @ b[adapter])).to(out.dtype)


def _used_adapters(adapter_ids: torch.Tensor) -> list[int]:
    """The adapters some token uses (one matmul each, not a [T, r, dim] gather of weights per token)."""
    return adapter_ids[adapter_ids >= 0].unique().tolist()


def segment_adapter_ids(cu_seqlens: torch.Tensor, segment_adapters: torch.Tensor) -> torch.Tensor:
    """Per-token adapter ids [T] from one adapter per request segment."""
    return segment_adapters.repeat_interleave(cu_seqlens[1:] - cu_seqlens[:-1])


def lora_shrink_segments(
    x: torch.Tensor,
    k_cache: torch.Tensor,
    rows: LoraRows,
    cu_seqlens: torch.Tensor,
    segment_adapters: torch.Tensor,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """lora_shrink for a prefill batch: request b's tokens cu_seqlens[b]:cu_seqlens[b + 1] use adapter
    segment_adapters[b] (-1: none). cu_seqlens[-1] == T. max_seqlen as in prefill_attention."""
    return lora_shrink(x, k_cache, rows, segment_adapter_ids(cu_seqlens, segment_adapters))


def lora_expand_segments(
    y: torch.Tensor,
    v_cache: torch.Tensor,
    rows: LoraRows,
    cu_seqlens: torch.Tensor,
    segment_adapters: torch.Tensor,
    out: torch.Tensor,
    max_seqlen: int | None = None,
) -> None:
    """lora_expand for a prefill batch, one adapter per request segment (see lora_shrink_segments)."""
    lora_expand(y, v_cache, rows, segment_adapter_ids(cu_seqlens, segment_adapters), out)
