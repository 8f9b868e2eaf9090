"""KV scatter: each program copies one token's K and V rows ([Hk, D]) into its pool slot."""

import torch
import triton
import triton.language as tl

from ._launch import last_dim_contiguous, pow2


@triton.jit
def _kv_scatter_kernel(
    K,
    V,
    KCache,
    VCache,
    Slots,
    heads,
    head_dim,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcs,
    stride_kch,
    stride_vcs,
    stride_vch,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(Slots + tok).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    mask = (offs_h < heads) & (offs_d < head_dim)
    k = tl.load(K + tok * stride_kt + offs_h * stride_kh + offs_d, mask=mask).to(tl.float32)
    v = tl.load(V + tok * stride_vt + offs_h * stride_vh + offs_d, mask=mask).to(tl.float32)
    tl.store(KCache + slot * stride_kcs + offs_h * stride_kch + offs_d, k.to(KCache.dtype.element_ty), mask=mask)
    tl.store(VCache + slot * stride_vcs + offs_h * stride_vch + offs_d, v.to(VCache.dtype.element_ty), mask=mask)


def kv_scatter(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Write each token's K and V into its pool slot. k, v: [T, Hk, D]; slots: [T] (int64)."""
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "pool buffers must have a contiguous head_dim"
    k, v = last_dim_contiguous(k), last_dim_contiguous(v)
    tokens, heads, head_dim = k.shape
    if tokens == 0:
        return
    _kv_scatter_kernel[(tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slots.contiguous(),
        heads,
        head_dim,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        BLOCK_H=pow2(heads),
        BLOCK_D=pow2(head_dim),
        num_warps=4,
    )
