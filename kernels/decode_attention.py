"""Decode attention through each request's slot list, flash-decoding style.

Grid: (request, KV head, context split). A program serves all query heads of its KV head, so each
K/V row is read from the pool once; its context split walks BLOCK_N slots per step with one
vectorised gather of [BLOCK_N, D] K and V rows. With more than one split, every split writes a
normalised partial output and its log-sum-exp, and a small second kernel merges them.
The split count is chosen so that the grid fills the GPU even for small batches of long contexts.
"""

import torch
import triton
import triton.language as tl

from ._launch import capability, dot_dtype, dot_precision, interpreted, last_dim_contiguous, pow2, sm_count

LOG2E = 1.4426950408889634


@triton.jit
def _decode_split_kernel(
    Q,
    KCache,
    VCache,
    SlotTable,
    SeqLens,
    Out,
    PartOut,
    PartLse,
    qk_scale,
    chunk,
    max_len,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_tb,
    stride_ob,
    stride_oh,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SLOT_OFFSET: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + req).to(tl.int32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, tl.minimum(seq_len, max_len))  # as the reference: at most the table's width
    # 64-bit scalar bases, small offset tiles: 64-bit offset tiles cost registers and spill
    Q += req * stride_qb + kv_head * GROUP * stride_qh
    KCache += kv_head * stride_kh
    VCache += kv_head * stride_vh
    SlotTable += req * stride_tb

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d[None, :] < HEAD_DIM
    qmask = (offs_g[:, None] < GROUP) & dmask
    q = tl.load(Q + offs_g[:, None] * stride_qh + offs_d[None, :], mask=qmask, other=0.0).to(tl.float32)

    row_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    # software-pipelined (also without tl.dot): the slot loads run a stage ahead of the K/V gathers
    for n0 in tl.range(lo, hi, BLOCK_N, num_stages=NUM_STAGES):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < hi
        slots = tl.load(SlotTable + offs_n, mask=nmask, other=0).to(SLOT_OFFSET)
        kv_mask = nmask[:, None] & dmask
        k = tl.load(KCache + (slots * stride_ks)[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(VCache + (slots * stride_vs)[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        if BLOCK_G == 1:  # one query head per KV head (MHA): a dot product per row, no tensor cores
            scores = tl.sum(k * q, axis=1)[None, :]
        else:
            scores = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION)
        scores = tl.where(nmask[None, :], scores * qk_scale, float("-inf"))  # [BLOCK_G, BLOCK_N], log2 units
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        rescale = tl.exp2(row_max - new_max)
        p = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(p, axis=1)
        if BLOCK_G == 1:
            pv = tl.sum(tl.trans(p) * v, axis=0)[None, :]
        else:
            pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
        acc = acc * rescale[:, None] + pv
        row_max = new_max

    nonempty = row_sum > 0.0  # a split past the end of a short request saw no key
    out = acc / tl.where(nonempty, row_sum, 1.0)[:, None]
    q_heads = kv_head * GROUP + offs_g
    if SPLIT:
        part = PartOut + req * stride_pb + q_heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :]
        tl.store(part, out, mask=qmask)
        lse = tl.where(nonempty, row_max + tl.log2(tl.where(nonempty, row_sum, 1.0)), float("-inf"))
        tl.store(PartLse + req * stride_lb + q_heads * stride_lh + split, lse, mask=offs_g < GROUP)
    else:
        tl.store(
            Out + req * stride_ob + q_heads[:, None] * stride_oh + offs_d[None, :],
            out.to(Out.dtype.element_ty),
            mask=qmask,
        )


@triton.jit
def _decode_merge_kernel(
    PartOut,
    PartLse,
    Out,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    smask = offs_s < num_splits
    lse = tl.load(PartLse + req * stride_lb + head * stride_lh + offs_s, mask=smask, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, axis=0))
    part = tl.load(
        PartOut + req * stride_pb + head * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=smask[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    out = tl.sum(part * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(Out + req * stride_ob + head * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)


def gpu_tiles(head_dim: int, group: int, hopper: bool) -> dict:
    """Tiles that compile without register spills on sm_90 (checked with compile_check.py; tune with bench.py).
    The MHA path holds its K and V tiles in registers; the GQA (tl.dot) path stages them in shared memory."""
    block_n = 64 if group > 1 and hopper else 32
    return dict(block_n=block_n if head_dim <= 128 else block_n // 2, num_warps=4, num_stages=3 if hopper else 2)


def _tiles(q: torch.Tensor, head_dim: int, group: int) -> dict:
    if interpreted(_decode_split_kernel):
        return dict(block_n=16, num_warps=1, num_stages=1)
    return gpu_tiles(head_dim, group, capability(q.device.index or 0)[0] >= 9)


def _num_splits(q: torch.Tensor, programs: int, max_len: int, block_n: int) -> int:
    """Enough programs for ~8 per SM (a few resident at a time, plus slack for ragged lengths),
    each split at least 4 blocks long."""
    if interpreted(_decode_split_kernel):
        return min(2, triton.cdiv(max_len, 2 * block_n)) or 1
    target = 8 * sm_count(q.device.index or 0)
    return max(1, min(triton.cdiv(target, programs), triton.cdiv(max_len, 4 * block_n), 64))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """One new token per request attends over its cached K/V, read through its slot list.

    q: [B, Hq, D]; slot_table: [B, max_len] (entries past seq_lens[b] are ignored); seq_lens: [B].
    The keyword-only arguments override the tiling heuristics (for tests and benchmarks).
    """
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "pool buffers must have a contiguous head_dim"
    q, slot_table = last_dim_contiguous(q), last_dim_contiguous(slot_table)
    batch, q_heads, head_dim = q.shape
    kv_heads, max_len = k_cache.shape[1], slot_table.shape[1]
    group = q_heads // kv_heads
    out = torch.empty((batch, q_heads, head_dim), dtype=q.dtype, device=q.device)
    if batch == 0 or max_len == 0:
        return out.zero_()
    tiles = _tiles(q, head_dim, group)
    block_n = block_n or tiles["block_n"]
    chunk = (
        triton.cdiv(triton.cdiv(max_len, num_splits or _num_splits(q, batch * kv_heads, max_len, block_n)), block_n)
        * block_n
    )
    splits = triton.cdiv(max_len, chunk)
    part_out = (
        torch.empty((batch, q_heads, splits, head_dim), dtype=torch.float32, device=q.device) if splits > 1 else out
    )
    part_lse = torch.empty((batch, q_heads, splits), dtype=torch.float32, device=q.device) if splits > 1 else out
    small_pool = max(k_cache.numel(), v_cache.numel()) < 2**31
    _decode_split_kernel[(batch, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        slot_table,
        seq_lens,
        out,
        part_out,
        part_lse,
        scale * LOG2E,
        chunk,
        max_len,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        slot_table.stride(0),
        out.stride(0),
        out.stride(1),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        GROUP=group,
        BLOCK_G=1 if group == 1 else pow2(group, 16),
        HEAD_DIM=head_dim,
        BLOCK_D=pow2(head_dim, 16),
        BLOCK_N=block_n,
        SLOT_OFFSET=tl.int32 if small_pool else tl.int64,
        SPLIT=splits > 1,
        DOT_DTYPE=dot_dtype(_decode_split_kernel, q.dtype),
        PRECISION=dot_precision(q.dtype),
        NUM_STAGES=num_stages or tiles["num_stages"],
        num_warps=num_warps or tiles["num_warps"],
    )
    if splits > 1:
        _decode_merge_kernel[(batch, q_heads)](
            part_out,
            part_lse,
            out,
            splits,
            part_out.stride(0),
            part_out.stride(1),
            part_out.stride(2),
            part_lse.stride(0),
            part_lse.stride(1),
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=pow2(head_dim, 16),
            BLOCK_S=pow2(splits),
            num_warps=4,
        )
    return out
