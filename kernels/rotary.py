"""Rotary embedding (Llama rotate-half): one program per token, all heads of q (or k) in one tile."""

import torch
import triton
import triton.language as tl

from ._launch import last_dim_contiguous, pow2


@triton.jit
def _rotary_kernel(
    X,
    Pos,
    InvFreq,
    Out,
    heads,
    stride_xt,
    stride_xh,
    stride_ot,
    stride_oh,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_f = tl.arange(0, BLOCK_HALF)
    fmask = offs_f < HALF
    mask = (offs_h < heads)[:, None] & fmask[None, :]
    angle = tl.load(Pos + tok).to(tl.float32) * tl.load(InvFreq + offs_f, mask=fmask, other=0.0)
    cos = tl.cos(angle)[None, :]
    sin = tl.sin(angle)[None, :]
    first = X + tok * stride_xt + offs_h[:, None] * stride_xh + offs_f[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    out = Out + tok * stride_ot + offs_h[:, None] * stride_oh + offs_f[None, :]
    tl.store(out, (x1 * cos - x2 * sin).to(Out.dtype.element_ty), mask=mask)
    tl.store(out + HALF, (x2 * cos + x1 * sin).to(Out.dtype.element_ty), mask=mask)


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    x = last_dim_contiguous(x)
    tokens, heads, head_dim = x.shape
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype, device=x.device)
    if tokens:
        half = head_dim // 2
        _rotary_kernel[(tokens,)](
            x,
            positions,
            inv_freq,
            out,
            heads,
            x.stride(0),
            x.stride(1),
            out.stride(0),
            out.stride(1),
            HALF=half,
            BLOCK_H=pow2(heads),
            BLOCK_HALF=pow2(half),
            num_warps=4,
        )
    return out


def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's rotary embedding (rotate-half convention). q: [T, Hq, D], k: [T, Hk, D], positions: [T],
    inv_freq: [D/2], the model's (possibly scaled) inverse frequencies; no copy when already fp32 on q's device."""
    inv_freq = inv_freq.to(device=q.device, dtype=torch.float32).contiguous()
    positions = positions.contiguous()
    return _rotate(q, positions, inv_freq), _rotate(k, positions, inv_freq)
