"""RMSNorm: one program per token row, the whole row in one tile."""

import torch
import triton
import triton.language as tl

from ._launch import last_dim_contiguous, pow2


@triton.jit
def _rms_norm_kernel(X, W, Out, hidden, stride_x, stride_out, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    tl.store(Out + row * stride_out + cols, (x * inv_rms * w).to(Out.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, H] -> [T, H]; computed in fp32, returned in x's dtype."""
    x = last_dim_contiguous(x)
    tokens, hidden = x.shape
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    block = pow2(hidden)
    num_warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    _rms_norm_kernel[(tokens,)](
        x, weight.contiguous(), out, hidden, x.stride(0), out.stride(0), eps, BLOCK=block, num_warps=num_warps
    )
    return out
