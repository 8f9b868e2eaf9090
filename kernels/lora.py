"""LoRA shrink (y = A x) and expand (out += scale * B y) reading adapter rows from the KV pool.

Row (proj * rank + i) of adapter j lies in pool slots lora_slots[j, row * per_row : (row + 1) * per_row],
each slot holding `width` = Hk * D consecutive elements (A rows in the K buffer, B columns in the V
buffer); see `reference.lora_rows`. Kernels walk a row slot by slot ("chunk" c covers row elements
[c * width, (c + 1) * width)), so every chunk is one gather of `rank` slot addresses.

Per-token variants (decode): one program per token, its own adapter. Segment variants (prefill):
one program per block of a request's tokens, whose adapter tile is loaded once and applied with tl.dot.
"""

import torch
import triton
import triton.language as tl

from ._launch import dot_dtype, dot_precision, interpreted, last_dim_contiguous, max_segment_len, pow2


@triton.jit
def _row_slots(LoraSlots, adapter, stride_la, first_row, per_row, chunk, offs_r, rmask):
    """Pool slot of chunk `chunk` of rows first_row + offs_r, as int64 [BLOCK_R]."""
    index = (first_row + offs_r) * per_row + chunk
    return tl.load(LoraSlots + adapter * stride_la + index, mask=rmask, other=0).to(tl.int64)


@triton.jit
def _shrink_kernel(X, Cache, LoraSlots, AdapterIds, Y, in_dim, width, per_row, first_row, rank,
                   stride_xt, stride_cs, stride_la, stride_yt, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    adapter = tl.load(AdapterIds + tok).to(tl.int64)
    if adapter < 0:
        return
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < rank
    acc = tl.zeros([BLOCK_R], tl.float32)
    for chunk in range(0, per_row):
        slots = _row_slots(LoraSlots, adapter, stride_la, first_row, per_row, chunk, offs_r, rmask)
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
def _expand_kernel(Y, Cache, LoraSlots, AdapterIds, Out, out_dim, width, per_row, first_row, rank, scale,
                   stride_yt, stride_cs, stride_la, stride_ot, BLOCK_R: tl.constexpr, BLOCK_O: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    adapter = tl.load(AdapterIds + tok).to(tl.int64)
    if adapter < 0:
        return
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < rank
    offs_o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    y = tl.load(Y + tok * stride_yt + offs_r, mask=rmask, other=0.0).to(tl.float32)
    for chunk in range(0, per_row):
        slots = _row_slots(LoraSlots, adapter, stride_la, first_row, per_row, chunk, offs_r, rmask)
        omask = (offs_o < width) & (chunk * width + offs_o < out_dim)
        b = tl.load(Cache + slots[:, None] * stride_cs + offs_o[None, :], mask=rmask[:, None] & omask[None, :], other=0.0).to(tl.float32)
        delta = tl.sum(b * y[:, None], axis=0) * scale
        out_ptr = Out + tok * stride_ot + chunk * width + offs_o
        tl.store(out_ptr, (tl.load(out_ptr, mask=omask, other=0.0).to(tl.float32) + delta).to(Out.dtype.element_ty), mask=omask)


@triton.jit
def _segment_block(CuSeqlens, SegmentAdapters, BLOCK_T: tl.constexpr):
    """For program (block, segment): (adapter, first token row, token offsets in the block, their mask, any work?)."""
    block = tl.program_id(0)
    segment = tl.program_id(1)
    adapter = tl.load(SegmentAdapters + segment).to(tl.int64)
    start = tl.load(CuSeqlens + segment).to(tl.int64)
    length = (tl.load(CuSeqlens + segment + 1) - start).to(tl.int32)
    offs_t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    busy = (adapter >= 0) & (block * BLOCK_T < length)
    return adapter, start, offs_t, offs_t < length, busy


@triton.jit
def _shrink_segments_kernel(X, Cache, LoraSlots, CuSeqlens, SegmentAdapters, Y, in_dim, width, per_row, first_row, rank,
                            stride_xt, stride_cs, stride_la, stride_yt, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    adapter, start, offs_t, tmask, busy = _segment_block(CuSeqlens, SegmentAdapters, BLOCK_T)
    if not busy:
        return
    X += start * stride_xt  # 64-bit scalar bases, 32-bit tile offsets (64-bit offset tiles spill)
    Y += start * stride_yt
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < rank
    acc = tl.zeros([BLOCK_T, BLOCK_R], tl.float32)
    for chunk in range(0, per_row):
        slots = _row_slots(LoraSlots, adapter, stride_la, first_row, per_row, chunk, offs_r, rmask)
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
def _expand_segments_kernel(Y, Cache, LoraSlots, CuSeqlens, SegmentAdapters, Out, out_dim, width, per_row, first_row, rank, scale,
                            stride_yt, stride_cs, stride_la, stride_ot, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_O: tl.constexpr, PRECISION: tl.constexpr):
    adapter, start, offs_t, tmask, busy = _segment_block(CuSeqlens, SegmentAdapters, BLOCK_T)
    if not busy:
        return
    Y += start * stride_yt
    Out += start * stride_ot
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < rank
    offs_o = tl.program_id(2) * BLOCK_O + tl.arange(0, BLOCK_O)
    y = tl.load(Y + offs_t[:, None] * stride_yt + offs_r[None, :], mask=tmask[:, None] & rmask[None, :], other=0.0).to(tl.float32)
    for chunk in range(0, per_row):
        slots = _row_slots(LoraSlots, adapter, stride_la, first_row, per_row, chunk, offs_r, rmask)
        omask = (offs_o < width) & (chunk * width + offs_o < out_dim)
        b = tl.load(Cache + (slots * stride_cs)[:, None] + offs_o[None, :], mask=rmask[:, None] & omask[None, :], other=0.0).to(tl.float32)
        delta = tl.dot(y, b, input_precision=PRECISION) * scale
        out_ptr = Out + offs_t[:, None] * stride_ot + chunk * width + offs_o[None, :]
        mask = tmask[:, None] & omask[None, :]
        tl.store(out_ptr, (tl.load(out_ptr, mask=mask, other=0.0).to(tl.float32) + delta).to(Out.dtype.element_ty), mask=mask)


def _pool_geometry(cache: torch.Tensor, lora_slots: torch.Tensor, rank: int) -> tuple[int, int]:
    """(width of one slot in elements, slots per adapter row)."""
    assert cache.is_contiguous(), "LoRA rows are read as whole contiguous pool slots"
    return cache.shape[1] * cache.shape[2], lora_slots.shape[1] // (4 * rank)


# GPU tiles (no register spills on sm_90, see compile_check.py): per-token kernels stream BLOCK wide
# slices of a row; segment kernels take SEGMENT_BLOCK_T tokens by SEGMENT_BLOCK columns per tl.dot
GPU_BLOCK = 256
GPU_SEGMENT_BLOCK_T = 64
GPU_SEGMENT_BLOCK = 64


def _block(n: int, interpreter_block: int, gpu_block: int, kernel) -> int:
    return min(pow2(n, 16), interpreter_block if interpreted(kernel) else gpu_block)


def lora_shrink(x: torch.Tensor, k_cache: torch.Tensor, lora_slots: torch.Tensor, adapter_ids: torch.Tensor, proj: int,
                rank: int) -> torch.Tensor:
    """y[t] = A_p(adapter of t) @ x[t]. x: [T, in]; adapter_ids: [T] (-1: no adapter, y = 0) -> [T, r] fp32."""
    x = last_dim_contiguous(x)
    width, per_row = _pool_geometry(k_cache, lora_slots, rank)
    y = torch.zeros((x.shape[0], rank), dtype=torch.float32, device=x.device)
    if x.shape[0] == 0 or lora_slots.shape[0] == 0:
        return y
    _shrink_kernel[(x.shape[0],)](
        x, k_cache, lora_slots, adapter_ids.contiguous(), y, x.shape[1], width, per_row, proj * rank, rank,
        x.stride(0), k_cache.stride(0), lora_slots.stride(0), y.stride(0),
        BLOCK_R=pow2(rank), BLOCK_K=_block(width, 128, GPU_BLOCK, _shrink_kernel), num_warps=4,
    )
    return y


def lora_expand(y: torch.Tensor, v_cache: torch.Tensor, lora_slots: torch.Tensor, adapter_ids: torch.Tensor, proj: int, rank: int,
                out: torch.Tensor, scale: float) -> None:
    """out[t] += scale * B_p(adapter of t) @ y[t], in place. y: [T, r]; out: [T, out_dim]."""
    assert out.stride(-1) == 1, "out must have a contiguous last dimension (it is updated in place)"
    width, per_row = _pool_geometry(v_cache, lora_slots, rank)
    if out.shape[0] == 0 or lora_slots.shape[0] == 0:
        return
    block_o = _block(min(width, out.shape[1]), 128, GPU_BLOCK, _expand_kernel)
    grid = (out.shape[0], triton.cdiv(min(width, out.shape[1]), block_o))
    _expand_kernel[grid](
        y, v_cache, lora_slots, adapter_ids.contiguous(), out, out.shape[1], width, per_row, proj * rank, rank, scale,
        y.stride(0), v_cache.stride(0), lora_slots.stride(0), out.stride(0),
        BLOCK_R=pow2(rank), BLOCK_O=block_o, num_warps=4,
    )


def lora_shrink_segments(x: torch.Tensor, k_cache: torch.Tensor, lora_slots: torch.Tensor, cu_seqlens: torch.Tensor,
                         segment_adapters: torch.Tensor, proj: int, rank: int, max_seqlen: int | None = None) -> torch.Tensor:
    """lora_shrink where request b's tokens cu_seqlens[b]:cu_seqlens[b + 1] all use adapter segment_adapters[b]."""
    x = last_dim_contiguous(x)
    width, per_row = _pool_geometry(k_cache, lora_slots, rank)
    y = torch.zeros((x.shape[0], rank), dtype=torch.float32, device=x.device)
    longest = max_segment_len(cu_seqlens, max_seqlen)
    if x.shape[0] == 0 or longest == 0 or lora_slots.shape[0] == 0:
        return y
    block_t = 16 if interpreted(_shrink_segments_kernel) else GPU_SEGMENT_BLOCK_T
    grid = (triton.cdiv(longest, block_t), len(cu_seqlens) - 1)
    _shrink_segments_kernel[grid](
        x, k_cache, lora_slots, cu_seqlens, segment_adapters.contiguous(), y, x.shape[1], width, per_row, proj * rank, rank,
        x.stride(0), k_cache.stride(0), lora_slots.stride(0), y.stride(0),
        BLOCK_T=block_t, BLOCK_R=pow2(rank, 16), BLOCK_K=_block(width, 64, GPU_SEGMENT_BLOCK, _shrink_segments_kernel),
        DOT_DTYPE=dot_dtype(_shrink_segments_kernel, x.dtype), PRECISION=dot_precision(x.dtype), num_warps=4,
    )
    return y


def lora_expand_segments(y: torch.Tensor, v_cache: torch.Tensor, lora_slots: torch.Tensor, cu_seqlens: torch.Tensor,
                         segment_adapters: torch.Tensor, proj: int, rank: int, out: torch.Tensor, scale: float,
                         max_seqlen: int | None = None) -> None:
    """lora_expand where request b's tokens cu_seqlens[b]:cu_seqlens[b + 1] all use adapter segment_adapters[b]."""
    assert out.stride(-1) == 1, "out must have a contiguous last dimension (it is updated in place)"
    width, per_row = _pool_geometry(v_cache, lora_slots, rank)
    longest = max_segment_len(cu_seqlens, max_seqlen)
    if out.shape[0] == 0 or longest == 0 or lora_slots.shape[0] == 0:
        return
    block_t = 16 if interpreted(_expand_segments_kernel) else GPU_SEGMENT_BLOCK_T
    block_o = _block(min(width, out.shape[1]), 64, GPU_SEGMENT_BLOCK, _expand_segments_kernel)
    grid = (triton.cdiv(longest, block_t), len(cu_seqlens) - 1, triton.cdiv(min(width, out.shape[1]), block_o))
    _expand_segments_kernel[grid](
        y, v_cache, lora_slots, cu_seqlens, segment_adapters.contiguous(), out, out.shape[1], width, per_row, proj * rank, rank, scale,
        y.stride(0), v_cache.stride(0), lora_slots.stride(0), out.stride(0),
        BLOCK_T=block_t, BLOCK_R=pow2(rank, 16), BLOCK_O=block_o, PRECISION=dot_precision(out.dtype), num_warps=4,
    )
