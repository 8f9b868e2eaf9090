"""Projections on oneDNN-packed weights (model/linear.py) against F.linear in float64, and where they are used."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from slora_vtc.backends.llama import build_backend
from slora_vtc.model.linear import can_pack, linear, pack, packed_weights
from slora_vtc.model.spec import get_model_spec
from slora_vtc.model.weights import dummy_weights

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@needs_onednn
@pytest.mark.parametrize("rows", [0, 1, 3, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_packed_weight_computes_x_w_transposed_plus_b(rows, with_bias):
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen) if with_bias else None
    x = torch.randn(rows, 40, generator=gen)
    with torch.inference_mode():
        y = linear(x, pack(w), b)
    assert y.shape == (rows, 96) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), reference(x, w, b), rtol=1e-5, atol=1e-4)


@needs_onednn
def test_inputs_that_are_views_or_have_more_dimensions_are_read_as_they_are():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(32, 16, generator=gen)
    for x in (torch.randn(5, 48, generator=gen)[:, 8:24], torch.randn(16, 5, generator=gen).t(), torch.randn(2, 3, 16)):
        with torch.inference_mode():
            torch.testing.assert_close(linear(x, pack(w)).double(), reference(x, w, None), rtol=1e-5, atol=1e-4)


def test_weights_as_loaded_go_to_f_linear_unchanged():
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    assert torch.equal(linear(x, w), F.linear(x, w))


@needs_onednn
def test_only_float32_on_a_cpu_is_packed():
    cpu = torch.device("cpu")
    assert can_pack(cpu, torch.float32)
    assert not can_pack(cpu, torch.bfloat16)
    assert not can_pack(torch.device("cuda"), torch.float32)


@needs_onednn
@pytest.mark.parametrize("tied", [False, True])
def test_every_projection_is_packed_and_a_tied_lm_head_stays_the_embedding(tied):
    spec = get_model_spec("tiny")
    weights = packed_weights(dummy_weights(spec, seed=1) if not tied else _tied(spec))
    projections = [t for layer in weights.layers for t in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
    assert all(t.is_mkldnn for t in projections)
    assert not weights.embed.is_mkldnn and not weights.layers[0].attn_norm.is_mkldnn
    assert (weights.lm_head is weights.embed) if tied else weights.lm_head.is_mkldnn


@needs_onednn
def test_the_torch_backend_packs_on_a_cpu_in_float32_only():
    """So that the logits tests against transformers (float32, CPU) run the packed path."""
    assert build_backend("torch", "tiny", pool_tokens=256).model.weights.layers[0].wqkv.is_mkldnn
    assert not build_backend("torch", "tiny", pool_tokens=256, dtype="bfloat16").model.weights.lm_head.is_mkldnn


def _tied(spec):
    weights = dummy_weights(spec, seed=1)
    return replace(weights, lm_head=weights.embed)
