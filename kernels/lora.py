"""LoRA shrink (y = A x) and expand (out += scale * B y) reading adapter rows from the KV pool.

One op works on one projection; `reference.LoraRows` says where each resident adapter's rows for it
lie: row i (i < ranks[j]) of adapter j takes the pool slots
slots[j, starts[j] + i * per_row + c] for c < per_row, each slot holding `width` = Hk * D consecutive
elements (A rows in the K buffer, B columns in the V buffer); see `reference.lora_rows`. Kernels
walk a row slot by slot ("chunk" c covers row elements [c * width, (c + 1) * width)), so every
chunk is one gather of up to BLOCK_R slot addresses. Adapters of different ranks mix in one batch:
BLOCK_R covers the largest rank (`max_rank`, a host int) and each program masks by its adapter's own
rank; an adapter of rank 0 (it does not adapt this projection) and a token without one (id -1) give
y = 0 and leave out untouched. Each adapter has its own scale.

Per-token variants (decode): one program per token, its own adapter. Segment variants (prefill):
one program per block of a request's tokens, whose adapter tile is loaded once and applied with tl.dot.
"""

import torch
import triton
import triton.language as tl

from ._launch import dot_dtype, dot_precision, interpreted, last_dim_contiguous, max_segment_len, pow2
from .reference import LoraRows


@triton.jit
def _adapter_rank(Ranks, adapter, max_rank):
    """This projection's rank for `adapter` (0 for no adapter, -1), never above max_rank (y's width)."""
    rank = tl.load(Ranks + tl.maximum(adapter, 0)).to(tl.int32)
    return tl.where(adapter >= 0, tl.minimum(rank, max_rank), 0)


@triton.jit
def _row_slots(LoraSlots, Starts, adapter, stride_la, per_row, chunk, offs_r, rmask):
    """Pool slot of chunk `chunk` of the adapter's rows offs_r, as int64 [BLOCK_R]."""
    start = tl.load(Starts + adapter).to(tl.int64)
    index = start + offs_r.to(tl.int64) * per_row + chunk
    return tl.load(LoraSlots + adapter * stride_la + index, mask=rmask, other=0).to(tl.int64)


@triton.jit
def _shrink_kernel(
    X,
    Cache,
    LoraSlots,
    Starts,
    Ranks,
    AdapterIds,
    Y,
    in_dim,
    width,
    per_row,
    max_rank,
    stride_xt,
    stride_cs,
    stride_la,
    stride_yt,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    adapter = tl.load(AdapterIds + tok).to(tl.int64)
    rank = _adapter_rank(Ranks, adapter, max_rank)
    if rank <= 0:
        return  # y stays 0
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < rank
    acc = tl.zeros([BLOCK_R], tl.float32)
    for chunk in range(0, per_row):
        slots = _row_slots(LoraSlots, Starts, adapter, stride_la, per_row, chunk, offs_r, rmask)
        chunk_len = tl.minimum(width, in_dim - chunk * width)
        for k0 in range(0, chunk_len, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < chunk_len
            x = tl.load(X + tok * stride_xt + chunk * width + offs_k, mask=kmask, other=0.0).to(tl.float32)
            a_mask = rmask[:, None] & kmask[None, :]
            a = tl.load(Cache + slots[:, None] * stride_cs + offs_k[None, :], mask=a_mask, other=0.0).to(tl.float32)
            acc += tl.sum(a * x[None, :], axis=1)
    tl.store(Y + tok * stride_yt + offs_r, acc, mask=rmask)


@triton.jit
def _expand_kernel(
    Y,
    Cache,
    LoraSlots,
    Starts,
    Ranks,
    Scales,
    AdapterIds,
    Out,
    out_dim,
    width,
    per_row,
    max_rank,
    stride_yt,
    stride_cs,
    stride_la,
    stride_ot,
    BLOCK_R: tl.constexpr,
    BLOCK_O: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    adapter = tl.load(AdapterIds + tok).to(tl.int64)
    rank = _adapter_rank(Ranks, adapter, max_rank)
    if rank <= 0:
        return  # out untouched
    scale = tl.load(Scales + adapter).to(tl.float32)
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < rank
    offs_o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    y = tl.load(Y + tok * stride_yt + offs_r, mask=rmask, other=0.0).to(tl.float32)
    for chunk in range(0, per_row):
        slots = _row_slots(LoraSlots, Starts, adapter, stride_la, per_row, chunk, offs_r, rmask)
        omask = (offs_o < width) & (chunk * width + offs_o < out_dim)
        b = tl.load(
            Cache + slots[:, None] * stride_cs + offs_o[None, :], mask=rmask[:, None] & omask[None, :], other=0.0
        ).to(tl.float32)
        delta = tl.sum(b * y[:, None], axis=0) * scale
        out_ptr = Out + tok * stride_ot + chunk * width + offs_o
        tl.store(
            out_ptr,
            (tl.load(out_ptr, mask=omask, other=0.0).to(tl.float32) + delta).to(Out.dtype.element_ty),
            mask=omask,
        )


@triton.jit
def _segment_block(CuSeqlens, SegmentAdapters, Ranks, max_rank, BLOCK_T: tl.constexpr):
    """For program (block, segment): (adapter, its rank, first token row, token offsets in the block, their
    mask, any work?)."""
    block = tl.program_id(0)
    segment = tl.program_id(1)
    adapter = tl.load(SegmentAdapters + segment).to(tl.int64)
    rank = _adapter_rank(Ranks, adapter, max_rank)
    start = tl.load(CuSeqlens + segment).to(tl.int64)
    length = (tl.load(CuSeqlens + segment + 1) - start).to(tl.int32)
    offs_t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    busy = (rank > 0) & (block * BLOCK_T < length)
    return adapter, rank, start, offs_t, offs_t < length, busy


@triton.jit
def _shrink_segments_kernel(
    X,
    Cache,
    LoraSlots,
    Starts,
    Ranks,
    CuSeqlens,
    SegmentAdapters,
    Y,
    in_dim,
    width,
    per_row,
    max_rank,
    stride_xt,
    stride_cs,
    stride_la,
    stride_yt,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    adapter, rank, start, offs_t, tmask, busy = _segment_block(CuSeqlens, SegmentAdapters, Ranks, max_rank, BLOCK_T)
    if not busy:
        return
    X += start * stride_xt  # 64-bit scalar bases, 32-bit tile offsets (64-bit offset tiles spill)
    Y += start * stride_yt
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < rank
    acc = tl.zeros([BLOCK_T, BLOCK_R], tl.float32)
    for chunk in range(0, per_row):
        slots = _row_slots(LoraSlots, Starts, adapter, stride_la, per_row, chunk, offs_r, rmask)
        chunk_len = tl.minimum(width, in_dim - chunk * width)
        for k0 in range(0, chunk_len, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            kmask = offs_k < chunk_len
            x_ptr = X + offs_t[:, None] * stride_xt + chunk * width + offs_k[None, :]
            x = tl.load(x_ptr, mask=tmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
            a_ptr = Cache + (slots * stride_cs)[None, :] + offs_k[:, None]  # A^T tile [BLOCK_K, BLOCK_R]
            a_t = tl.load(a_ptr, mask=kmask[:, None] & rmask[None, :], other=0.0).to(tl.float32)
            acc += tl.dot(x.to(DOT_DTYPE), a_t.to(DOT_DTYPE), input_precision=PRECISION)
    tl.store(Y + offs_t[:, None] * stride_yt + offs_r[None, :], acc, mask=tmask[:, None] & rmask[None, :])


@triton.jit
def _expand_segments_kernel(
    Y,
    Cache,
    LoraSlots,
    Starts,
    Ranks,
    Scales,
    CuSeqlens,
    SegmentAdapters,
    Out,
    out_dim,
    width,
    per_row,
    max_rank,
    stride_yt,
    stride_cs,
    stride_la,
    stride_ot,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_O: tl.constexpr,
    PRECISION: tl.constexpr,
):
    adapter, rank, start, offs_t, tmask, busy = _segment_block(CuSeqlens, SegmentAdapters, Ranks, max_rank, BLOCK_T)
    if not busy:
        return
    scale = tl.load(Scales + adapter).to(tl.float32)
    Y += start * stride_yt
    Out += start * stride_ot
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < rank
    offs_o = tl.program_id(2) * BLOCK_O + tl.arange(0, BLOCK_O)
    y = tl.load(Y + offs_t[:, None] * stride_yt + offs_r[None, :], mask=tmask[:, None] & rmask[None, :], other=0.0).to(
        tl.float32
    )
    for chunk in range(0, per_row):
        slots = _row_slots(LoraSlots, Starts, adapter, stride_la, per_row, chunk, offs_r, rmask)
        omask = (offs_o < width) & (chunk * width + offs_o < out_dim)
        b = tl.load(
            Cache + (slots * stride_cs)[:, None] + offs_o[None, :], mask=rmask[:, None] & omask[None, :], other=0.0
        ).to(tl.float32)
        delta = tl.dot(y, b, input_precision=PRECISION) * scale
        out_ptr = Out + offs_t[:, None] * stride_ot + chunk * width + offs_o[None, :]
        mask = tmask[:, None] & omask[None, :]
        tl.store(
            out_ptr, (tl.load(out_ptr, mask=mask, other=0.0).to(tl.float32) + delta).to(Out.dtype.element_ty), mask=mask
        )


def _pool_width(cache: torch.Tensor) -> int:
    """Elements in one pool slot."""
    assert cache.is_contiguous(), "LoRA rows are read as whole contiguous pool slots"
    return cache.shape[1] * cache.shape[2]


def _rows_args(rows: LoraRows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(slots, starts, ranks) ready for a launch: slots indexed with their row stride, the others contiguous."""
    assert rows.slots.stride(-1) == 1, "LoraRows.slots must have a contiguous last dimension"
    return rows.slots, rows.starts.contiguous(), rows.ranks.contiguous()


def _nothing_to_do(tokens: int, rows: LoraRows) -> bool:
    return tokens == 0 or rows.slots.shape[0] == 0 or rows.max_rank <= 0


# GPU tiles (no register spills on sm_90, see compile_check.py): per-token kernels stream slices of
# a row, GPU_BLOCK wide up to rank 16 and narrower above (a [BLOCK_R, block] tile of at most
# GPU_TILE elements); segment kernels take SEGMENT_BLOCK_T tokens by SEGMENT_BLOCK columns per tl.dot
GPU_BLOCK = 256
GPU_TILE = 16 * GPU_BLOCK
GPU_SEGMENT_BLOCK_T = 64
GPU_SEGMENT_BLOCK = 64


def gpu_block(block_r: int) -> int:
    """Row slice width of the per-token kernels on a GPU for a BLOCK_R of `block_r`."""
    return max(16, min(GPU_BLOCK, GPU_TILE // block_r))


def _block(n: int, interpreter_block: int, gpu_block: int, kernel) -> int:
    return min(pow2(n, 16), interpreter_block if interpreted(kernel) else gpu_block)


def lora_shrink(x: torch.Tensor, k_cache: torch.Tensor, rows: LoraRows, adapter_ids: torch.Tensor) -> torch.Tensor:
    """y[t] = A(adapter of t) @ x[t]. x: [T, in]; adapter_ids: [T] (-1: no adapter, y = 0) -> [T, max_rank] fp32."""
    x = last_dim_contiguous(x)
    width = _pool_width(k_cache)
    y = torch.zeros((x.shape[0], rows.max_rank), dtype=torch.float32, device=x.device)
    if _nothing_to_do(x.shape[0], rows):
        return y
    slots, starts, ranks = _rows_args(rows)
    _shrink_kernel[(x.shape[0],)](
        x,
        k_cache,
        slots,
        starts,
        ranks,
        adapter_ids.contiguous(),
        y,
        x.shape[1],
        width,
        rows.per_row,
        rows.max_rank,
        x.stride(0),
        k_cache.stride(0),
        slots.stride(0),
        y.stride(0),
        BLOCK_R=pow2(rows.max_rank),
        BLOCK_K=_block(width, 128, gpu_block(pow2(rows.max_rank)), _shrink_kernel),
        num_warps=4,
    )
    return y


def lora_expand(
    y: torch.Tensor, v_cache: torch.Tensor, rows: LoraRows, adapter_ids: torch.Tensor, out: torch.Tensor
) -> None:
    """out[t] += scale(adapter of t) * B(adapter of t) @ y[t], in place. y: [T, max_rank]; out: [T, out_dim]."""
    assert out.stride(-1) == 1, "out must have a contiguous last dimension (it is updated in place)"
    y = last_dim_contiguous(y)
    width = _pool_width(v_cache)
    if _nothing_to_do(out.shape[0], rows):
        return
    slots, starts, ranks = _rows_args(rows)
    block_o = _block(min(width, out.shape[1]), 128, gpu_block(pow2(rows.max_rank)), _expand_kernel)
    grid = (out.shape[0], triton.cdiv(min(width, out.shape[1]), block_o))
    _expand_kernel[grid](
        y,
        v_cache,
        slots,
        starts,
        ranks,
        rows.scales.contiguous(),
        adapter_ids.contiguous(),
        out,
        out.shape[1],
        width,
        rows.per_row,
        rows.max_rank,
        y.stride(0),
        v_cache.stride(0),
        slots.stride(0),
        out.stride(0),
        BLOCK_R=pow2(rows.max_rank),
        BLOCK_O=block_o,
        num_warps=4,
    )


def lora_shrink_segments(
    x: torch.Tensor,
    k_cache: torch.Tensor,
    rows: LoraRows,
    cu_seqlens: torch.Tensor,
    segment_adapters: torch.Tensor,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """lora_shrink where request b's tokens cu_seqlens[b]:cu_seqlens[b + 1] all use adapter
    segment_adapters[b] (-1: none)."""
    x = last_dim_contiguous(x)
    width = _pool_width(k_cache)
    y = torch.zeros((x.shape[0], rows.max_rank), dtype=torch.float32, device=x.device)
    longest = max_segment_len(cu_seqlens, max_seqlen)
    if _nothing_to_do(x.shape[0], rows) or longest == 0:
        return y
    slots, starts, ranks = _rows_args(rows)
    block_t = 16 if interpreted(_shrink_segments_kernel) else GPU_SEGMENT_BLOCK_T
    grid = (triton.cdiv(longest, block_t), len(cu_seqlens) - 1)
    _shrink_segments_kernel[grid](
        x,
        k_cache,
        slots,
        starts,
        ranks,
        cu_seqlens,
        segment_adapters.contiguous(),
        y,
        x.shape[1],
        width,
        rows.per_row,
        rows.max_rank,
        x.stride(0),
        k_cache.stride(0),
        slots.stride(0),
        y.stride(0),
        BLOCK_T=block_t,
        BLOCK_R=pow2(rows.max_rank, 16),
        BLOCK_K=_block(width, 64, GPU_SEGMENT_BLOCK, _shrink_segments_kernel),
        DOT_DTYPE=dot_dtype(_shrink_segments_kernel, x.dtype),
        PRECISION=dot_precision(x.dtype),
        num_warps=4,
    )
    return y


def lora_expand_segments(
    y: torch.Tensor,
    v_cache: torch.Tensor,
    rows: LoraRows,
    cu_seqlens: torch.Tensor,
    segment_adapters: torch.Tensor,
    out: torch.Tensor,
    max_seqlen: int | None = None,
) -> None:
    """lora_expand where request b's tokens cu_seqlens[b]:cu_seqlens[b + 1] all use adapter
    segment_adapters[b] (-1: none)."""
    assert out.stride(-1) == 1, "out must have a contiguous last dimension (it is updated in place)"
    y = last_dim_contiguous(y)
    width = _pool_width(v_cache)
    longest = max_segment_len(cu_seqlens, max_seqlen)
    if _nothing_to_do(out.shape[0], rows) or longest == 0:
        return
    slots, starts, ranks = _rows_args(rows)
    block_t = 16 if interpreted(_expand_segments_kernel) else GPU_SEGMENT_BLOCK_T
    block_o = _block(min(width, out.shape[1]), 64, GPU_SEGMENT_BLOCK, _expand_segments_kernel)
    grid = (triton.cdiv(longest, block_t), len(cu_seqlens) - 1, triton.cdiv(min(width, out.shape[1]), block_o))
    _expand_segments_kernel[grid](
        y,
        v_cache,
        slots,
        starts,
        ranks,
        rows.scales.contiguous(),
        cu_seqlens,
        segment_adapters.contiguous(),
        out,
        out.shape[1],
        width,
        rows.per_row,
        rows.max_rank,
        y.stride(0),
        v_cache.stride(0),
        slots.stride(0),
        out.stride(0),
        BLOCK_T=block_t,
        BLOCK_R=pow2(rows.max_rank, 16),
        BLOCK_O=block_o,
        PRECISION=dot_precision(out.dtype),
        num_warps=4,
    )
