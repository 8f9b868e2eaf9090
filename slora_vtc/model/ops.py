"""The kernel set a model runs on: torch (CPU), Triton (GPU) or the plain references; same signatures."""

from slora_vtc.errors import UserError

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


def load_ops(name: str):
    """`torch` (torch_ops.py), or `reference` / `triton` from the slora_vtc_kernels package."""
    if name == "torch":
        from slora_vtc.model.torch_ops import TorchOps

        return TorchOps()
    import slora_vtc_kernels

    try:
        if hasattr(slora_vtc_kernels, "ops"):
            ops = slora_vtc_kernels.ops(name)
        elif name == "reference":
            from slora_vtc_kernels import reference as ops
        else:
            raise ImportError(f"slora_vtc_kernels has no '{name}' kernels")
    except (ImportError, KeyError, ValueError) as e:
        raise UserError(f"the '{name}' kernels are not available: {e}") from None
    missing = [op for op in OP_NAMES if not hasattr(ops, op)]
    if missing:
        raise UserError(f"the '{name}' kernels lack {', '.join(missing)}")
    return ops
