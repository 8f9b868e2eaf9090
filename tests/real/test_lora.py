"""LoRA adapters in the unified pool: merged-weight equivalence, mixed batches, the slot layout."""

from dataclasses import replace

import pytest
import torch
from llama_util import real_engine, record_logits, request, tiny_backend
from slora_vtc_kernels import reference

from slora_vtc.backends.llama import LlamaBackend
from slora_vtc.errors import UserError
from slora_vtc.model.llama import Llama
from slora_vtc.model.lora import LoraWeights, adapter_slots, dummy_adapter, projection_dims, write_adapter
from slora_vtc.model.ops import load_ops
from slora_vtc.model.pool import KVPool
from slora_vtc.model.spec import get_model_spec
from slora_vtc.model.weights import LlamaWeights
from slora_vtc.request import State

SPEC = get_model_spec("tiny")
RANK, SCALE = 4, 0.5
PROMPTS = [[1, 17, 5, 99, 3, 42, 7], [1, 64, 3], [1, 9, 9, 120, 33, 2, 2, 80, 15, 4, 11], [1, 200]]


def adapter(name: str) -> LoraWeights:
    """Large enough to change the output visibly (B is N(0, 0.02) in the dummy adapters)."""
    a = dummy_adapter(SPEC, name, RANK)
    return LoraWeights(a.a, tuple(tuple(10 * b for b in layer) for layer in a.b))


def merged(weights: LlamaWeights, lora: LoraWeights) -> LlamaWeights:
    """W + scale * B A for q, k, v (stacked in wqkv) and o."""
    layers = []
    for layer, a, b in zip(weights.layers, lora.a, lora.b):
        delta = [SCALE * bp @ ap for ap, bp in zip(a, b)]
        layers.append(replace(layer, wqkv=layer.wqkv + torch.cat(delta[:3]), wo=layer.wo + delta[3]))
    return replace(weights, layers=tuple(layers))


def run(backend: LlamaBackend, requests, pool: int = 600):
    logits = record_logits(backend)
    engine = real_engine(backend, pool, clients=("a",), lora_rank=backend.lora_rank)
    engine.run(requests)
    assert all(r.state is State.FINISHED for r in requests)
    assert engine.memory.pool.num_free == pool and engine.memory.adapters == {}
    return [torch.stack(logits[r.rid]) for r in requests]


def lora_backend() -> LlamaBackend:
    backend = tiny_backend(lora_rank=RANK, lora_scale=SCALE, seed=1)
    backend.adapters.update({"x": adapter("x"), "y": adapter("y")})
    return backend


def test_adapter_equals_merged_weights():
    ours = run(lora_backend(), [request(PROMPTS[0], 6, adapter="x"), request(PROMPTS[2], 4, adapter="x")])
    base = tiny_backend(seed=1)
    merged_backend = LlamaBackend(Llama(SPEC, merged(base.model.weights, adapter("x")), KVPool(SPEC, 600, "cpu", torch.float32), load_ops("torch")))
    expected = run(merged_backend, [request(PROMPTS[0], 6), request(PROMPTS[2], 4)])
    without = run(base, [request(PROMPTS[0], 6), request(PROMPTS[2], 4)])
    for got, want, plain in zip(ours, expected, without):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert (got[0] - plain[0]).abs().max() > 1e-2  # the adapter does change the output


def test_mixed_batch_matches_each_request_alone():
    adapters = ["x", "y", None, "x"]
    together = run(lora_backend(), [request(p, 5 + i, adapter=a) for i, (p, a) in enumerate(zip(PROMPTS, adapters))])
    for i, (p, a) in enumerate(zip(PROMPTS, adapters)):
        alone = run(lora_backend(), [request(p, 5 + i, adapter=a)])[0]
        torch.testing.assert_close(together[i], alone, atol=1e-5, rtol=1e-5)


def test_pool_layout_matches_the_reference_kernels():
    """Row p * r + i holds A_p[i] in the K buffer and B_p[:, i] in the V buffer, over slots_per_row slots."""
    pool = KVPool(SPEC, 100, "cpu", torch.float32)
    lora = adapter("x")
    slots = torch.randperm(100, generator=torch.Generator().manual_seed(0))[: adapter_slots(SPEC, RANK)]
    assert len(slots) == 4 * RANK * 2  # tiny is GQA: a 64-wide row spans two 2 x 16 slots
    write_adapter(pool, slots, lora, SPEC)
    for layer in range(SPEC.num_layers):
        for p, (d_in, d_out) in enumerate(projection_dims(SPEC)):
            a_rows = reference.lora_rows(pool.k[layer], slots[None], p, RANK, d_in)[0]
            b_rows = reference.lora_rows(pool.v[layer], slots[None], p, RANK, d_out)[0]
            assert torch.equal(a_rows, lora.a[layer][p]) and torch.equal(b_rows, lora.b[layer][p].T)


def test_adapter_of_the_wrong_rank_is_refused():
    backend = tiny_backend(lora_rank=RANK)
    backend.adapters["z"] = dummy_adapter(SPEC, "z", RANK + 1)
    with pytest.raises(UserError, match="rank 5"):
        backend.load_adapter("z", torch.arange(adapter_slots(SPEC, RANK)).numpy())


def test_dummy_adapters_are_seeded_by_name():
    assert torch.equal(dummy_adapter(SPEC, "x", 2).a[1][3], dummy_adapter(SPEC, "x", 2).a[1][3])
    assert not torch.equal(dummy_adapter(SPEC, "x", 2).a[1][3], dummy_adapter(SPEC, "y", 2).a[1][3])
