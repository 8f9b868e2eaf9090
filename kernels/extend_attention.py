"""Prefill over a cached prefix: the prefill kernel's flash-attention loop, with K/V read through a slot table.

Request b computes only its new tokens; their queries sit at positions cached_len .. cached_len + new - 1
and attend causally over the request's whole context (cached slots, then its new ones), whose K/V are
already in the pool (the model scatters the new tokens' K/V first). Grid: (query block, request,
query head), as prefill_attention; a query block sees keys up to its last row's position only.
"""

import torch
import triton
import triton.language as tl

from ._launch import capability, dot_dtype, dot_precision, interpreted, last_dim_contiguous, max_segment_len, pow2
from .prefill_attention import attend_block
from .prefill_attention import gpu_tiles as prefill_tiles

LOG2E = 1.4426950408889634


@triton.jit
def _extend_kernel(
    Q,
    KCache,
    VCache,
    Out,
    CuSeqlens,
    SlotTable,
    CachedLens,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_tb,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SLOT_OFFSET: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    block_m = tl.program_id(0)
    req = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(CuSeqlens + req).to(tl.int64)
    length = (tl.load(CuSeqlens + req + 1) - start).to(tl.int32)
    if block_m * BLOCK_M >= length:
        return
    cached = tl.load(CachedLens + req).to(tl.int32)
    kv_head = head // GROUP
    Q += start * stride_qt + head * stride_qh
    Out += start * stride_ot + head * stride_oh
    KCache += kv_head * stride_kh
    VCache += kv_head * stride_vh
    SlotTable += req.to(tl.int64) * stride_tb
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d[None, :] < HEAD_DIM
    rows_mask = (offs_m[:, None] < length) & dmask
    q = (
        tl.load(Q + offs_m[:, None] * stride_qt + offs_d[None, :], mask=rows_mask, other=0.0)
        .to(tl.float32)
        .to(DOT_DTYPE)
    )
    query_pos = cached + offs_m
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # causal: this query block sees the context up to its last row's position
    key_end = cached + tl.minimum(length, (block_m + 1) * BLOCK_M)
    for n0 in range(0, key_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < key_end
        slots = tl.load(SlotTable + offs_n, mask=nmask, other=0).to(SLOT_OFFSET)
        kv_mask = nmask[:, None] & dmask
        k = tl.load(KCache + (slots * stride_ks)[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(VCache + (slots * stride_vs)[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        visible = query_pos[:, None] >= offs_n[None, :]
        row_max, row_sum, acc = attend_block(q, k, v, visible, row_max, row_sum, acc, qk_scale, DOT_DTYPE, PRECISION)
    out = acc / row_sum[:, None]
    tl.store(Out + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty), mask=rows_mask)


def gpu_tiles(head_dim: int, hopper: bool, fp32: bool = False) -> dict:
    """The prefill kernel's tiles (checked with compile_check.py); in fp32 the slot gather's extra registers
    make those spill, so fp32 gets smaller ones."""
    if not fp32:
        return prefill_tiles(head_dim, hopper)
    if head_dim <= 128:
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=2)
    return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2)


def _tiles(q: torch.Tensor, head_dim: int) -> dict:
    if interpreted(_extend_kernel):
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    return gpu_tiles(head_dim, capability(q.device.index or 0)[0] >= 9, q.dtype == torch.float32)


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
    """Prefill of requests whose first cached_lens[b] tokens already have K/V in the pool.

    q: [T, Hq, D], the new tokens only; cu_seqlens: [B + 1] their offsets; slot_table: [B, max_ctx], each
    request's context slots (cached, then new); max_seqlen: the most new tokens of a request, if known.
    """
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "pool buffers must have a contiguous head_dim"
    q, slot_table = last_dim_contiguous(q), last_dim_contiguous(slot_table)
    tokens, q_heads, head_dim = q.shape
    out = torch.empty((tokens, q_heads, head_dim), dtype=q.dtype, device=q.device)
    longest = max_segment_len(cu_seqlens, max_seqlen)
    if tokens == 0 or longest == 0:
        return out
    tiles = _tiles(q, head_dim)
    small_pool = max(k_cache.numel(), v_cache.numel()) < 2**31
    grid = (triton.cdiv(longest, tiles["BLOCK_M"]), len(cu_seqlens) - 1, q_heads)
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        cu_seqlens,
        slot_table,
        cached_lens,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        out.stride(0),
        out.stride(1),
        slot_table.stride(0),
        GROUP=q_heads // k_cache.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=pow2(head_dim, 16),
        SLOT_OFFSET=tl.int32 if small_pool else tl.int64,
        DOT_DTYPE=dot_dtype(_extend_kernel, q.dtype),
        PRECISION=dot_precision(q.dtype),
        **tiles,
    )
    return out
