"""slora_vtc_kernels: Triton kernels for the real engine, each beside a torch reference.

`reference` holds plain-torch versions of every op (the CPU path and the tests' ground truth);
the Triton versions have the same signatures. Import `ops(name)` to get either set.
"""

import os
from types import SimpleNamespace

OP_NAMES = (
    "rms_norm",
    "rotary_embedding",
    "kv_scatter",
    "prefill_attention",
    "extend_attention",
    "decode_attention",
    "lora_shrink",
    "lora_expand",
    "lora_shrink_segments",
    "lora_expand_segments",
)
BACKENDS = ("reference", "triton")


def ops(name: str) -> SimpleNamespace:
    """All ops of one implementation: "reference" (plain torch) or "triton".

    Without a CUDA device, "triton" runs in the Triton interpreter: TRITON_INTERPRET=1 is set here
    unless the caller chose otherwise, which only takes effect if the kernels were not imported yet.
    """
    if name == "reference":
        from . import reference as module
    elif name == "triton":
        _interpret_without_cuda()
        from . import triton_ops as module
    else:
        raise ValueError(f"unknown kernel set {name!r}; known: {', '.join(BACKENDS)}")
    return SimpleNamespace(name=name, **{op: getattr(module, op) for op in OP_NAMES})


def _interpret_without_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
