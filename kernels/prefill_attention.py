"""Causal attention over ragged prompts: flash-attention loop over key blocks with online softmax.

Grid: (query block, request, query head). Programs whose query block lies past their request's
length exit at once, so the grid can be sized from the longest prompt without padding the batch.
"""

import torch
import triton
import triton.language as tl

from ._launch import capability, dot_dtype, dot_precision, interpreted, last_dim_contiguous, max_segment_len, pow2

LOG2E = 1.4426950408889634


@triton.jit
def attend_block(q, k, v, visible, row_max, row_sum, acc, qk_scale, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of the online softmax: fold the visible scores of q against k into (max, sum, acc)."""
    scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * qk_scale  # log2 units
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    rescale = tl.exp2(row_max - new_max)
    p = tl.exp2(scores - new_max[:, None])
    row_sum = row_sum * rescale + tl.sum(p, axis=1)
    acc = acc * rescale[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
    return new_max, row_sum, acc


@triton.jit
def _prefill_kernel(
    Q,
    K,
    V,
    Out,
    CuSeqlens,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
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
    kv_head = head // GROUP
    # 64-bit scalar bases, 32-bit tile offsets: 64-bit offset tiles cost registers and spill
    Q += start * stride_qt + head * stride_qh
    K += start * stride_kt + kv_head * stride_kh
    V += start * stride_vt + kv_head * stride_vh
    Out += start * stride_ot + head * stride_oh
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d[None, :] < HEAD_DIM
    rows_mask = (offs_m[:, None] < length) & dmask
    q = (
        tl.load(Q + offs_m[:, None] * stride_qt + offs_d[None, :], mask=rows_mask, other=0.0)
        .to(tl.float32)
        .to(DOT_DTYPE)
    )
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # causal: this query block sees keys up to its last row only
    key_end = tl.minimum(length, (block_m + 1) * BLOCK_M)
    for n0 in range(0, key_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < length) & dmask
        k = tl.load(K + offs_n[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(V + offs_n[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        visible = offs_m[:, None] >= offs_n[None, :]
        row_max, row_sum, acc = attend_block(q, k, v, visible, row_max, row_sum, acc, qk_scale, DOT_DTYPE, PRECISION)
    out = acc / row_sum[:, None]
    tl.store(Out + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty), mask=rows_mask)


def gpu_tiles(head_dim: int, hopper: bool, fp32: bool = False) -> dict:
    """Tiles that compile without register spills on sm_90 (checked with compile_check.py).
    fp32 (a correctness path on a GPU) gets small tiles that fit any GPU's shared memory."""
    if fp32:
        return dict(BLOCK_M=32, BLOCK_N=32 if head_dim <= 128 else 16, num_warps=4, num_stages=2)
    stages = 3 if hopper else 2
    if head_dim <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=stages)
    if head_dim <= 128:
        return dict(BLOCK_M=128 if hopper else 64, BLOCK_N=64, num_warps=8, num_stages=stages)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)


def _tiles(q: torch.Tensor, head_dim: int) -> dict:
    if interpreted(_prefill_kernel):
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    return gpu_tiles(head_dim, capability(q.device.index or 0)[0] >= 9, q.dtype == torch.float32)


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
    max_seqlen: the longest prompt, if the caller knows it (saves a device sync).
    """
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    tokens, q_heads, head_dim = q.shape
    out = torch.empty((tokens, q_heads, head_dim), dtype=q.dtype, device=q.device)
    longest = max_segment_len(cu_seqlens, max_seqlen)
    if tokens == 0 or longest == 0:
        return out
    tiles = _tiles(q, head_dim)
    grid = (triton.cdiv(longest, tiles["BLOCK_M"]), len(cu_seqlens) - 1, q_heads)
    _prefill_kernel[grid](
        q,
        k,
        v,
        out,
        cu_seqlens,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        GROUP=q_heads // k.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=pow2(head_dim, 16),
        DOT_DTYPE=dot_dtype(_prefill_kernel, q.dtype),
        PRECISION=dot_precision(q.dtype),
        **tiles,
    )
    return out
