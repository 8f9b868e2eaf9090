"""Launch helpers shared by the Triton kernels: interpreter detection, dtypes, tile sizes."""

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def interpreted(kernel) -> bool:
    """True when `kernel` was defined under TRITON_INTERPRET=1 (it then runs on the CPU interpreter)."""
    return isinstance(kernel, InterpretedFunction)


def dot_dtype(kernel, dtype: torch.dtype):
    """Operand dtype for tl.dot: the 16-bit input dtype on a GPU (tensor cores, exact products,
    fp32 accumulation); fp32 under the interpreter, whose 16-bit arithmetic is wrong."""
    return tl.float32 if interpreted(kernel) else TL_DTYPES[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 operands: true fp32 for fp32 tensors; tf32 (error ~5e-4, below fp16/bf16 rounding) otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


def pow2(n: int, minimum: int = 1) -> int:
    return max(minimum, triton.next_power_of_2(int(n)))


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Kernels index rows with arbitrary strides but read the last dimension as contiguous."""
    return t if t.stride(-1) == 1 else t.contiguous()


def max_segment_len(cu_seqlens: torch.Tensor, max_seqlen: int | None) -> int:
    """The longest segment; pass `max_seqlen` from the host to avoid a device sync."""
    if max_seqlen is not None:
        return int(max_seqlen)
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if len(cu_seqlens) > 1 else 0
