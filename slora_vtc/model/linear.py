"""The model's projections, y = x W^T + b, with W packed once for oneDNN on a CPU.

PyTorch computes a float32 `F.linear` on a CPU with MKL's sgemm. On the AMD EPYC machines this project is
measured on, that ran the tiny Llama's products at less than half the speed of oneDNN's matmul given the
same weights reordered once into its blocked layout (benchmarks/README.md, "Our serve against vLLM"):
vLLM's CPU build computes its linear layers with oneDNN and prepacked weights too. So on a CPU, in float32,
the weights of every projection are packed when the model is built (`packed_weights`) and `linear` sends
a packed weight to oneDNN; everywhere else (CUDA, other dtypes, a torch without oneDNN) the weights stay
as loaded and `linear` is `F.linear`. A packed weight replaces the loaded one, so memory does not grow,
except for a tied `lm_head`, which stays the embedding itself (not packed).
"""

from dataclasses import replace

import torch
import torch.nn.functional as F

from slora_vtc.model.weights import LayerWeights, LlamaWeights


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b for a weight as loaded or as `pack` left it."""
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return F.linear(x, w, b)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this device and dtype get packed weights: a CPU, float32 (the MKL path measured), oneDNN built in."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


def pack(w: torch.Tensor) -> torch.Tensor:
    """W [out, in] reordered into oneDNN's blocked layout (an opaque tensor `linear` reads)."""
    return torch.ops.mkldnn._reorder_linear_weight(w)


def packed_weights(weights: LlamaWeights) -> LlamaWeights:
    """The same weights, every projection packed (a tied lm_head is the embedding and stays as it is)."""
    tied = weights.lm_head is weights.embed
    return replace(
        weights,
        layers=tuple(_packed_layer(layer) for layer in weights.layers),
        lm_head=weights.lm_head if tied else pack(weights.lm_head),
    )


def _packed_layer(layer: LayerWeights) -> LayerWeights:
    return replace(
        layer, wqkv=pack(layer.wqkv), wo=pack(layer.wo), w_gate_up=pack(layer.w_gate_up), w_down=pack(layer.w_down)
    )
