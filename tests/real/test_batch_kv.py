"""The decode batch's dense K/V copy (model/batch_kv.py): the same attention as reading the pool, step after step."""

import pytest
import torch

from slora_vtc.model.batch_kv import BatchKV
from slora_vtc.request import State
from slora_vtc_kernels import reference
from tests.helpers.llama import dummies, real_engine, record_logits, request, tiny_backend

LAYERS, SLOTS, KV_HEADS, HEADS, DIM = 2, 64, 2, 4, 8


def _pool(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(LAYERS, SLOTS, KV_HEADS, DIM, generator=gen), torch.randn(
        LAYERS, SLOTS, KV_HEADS, DIM, generator=gen
    )


@pytest.mark.parametrize(
    "matmuls, dtype, tolerance",
    [(True, torch.float32, 1e-5), (False, torch.float32, 1e-5), (True, torch.bfloat16, 2e-2)],
    ids=["matmuls", "sdpa", "bfloat16-sdpa"],
)
def test_dense_attention_matches_the_reference_over_steps_with_ragged_lengths(matmuls, dtype, tolerance):
    """Three requests of 5, 2 and 7 tokens decode 4 steps: each step the new token's K/V go into the pool (as the
    model's kv_scatter does), the first step fills the dense copy, the others only write the new token; every
    step's attention equals the reference's read through the slot table (in float32 over the same values),
    whether the copy is attended by two matmuls or by SDPA (bfloat16 always takes SDPA)."""
    gen = torch.Generator().manual_seed(0)
    k_pool, v_pool = (p.to(dtype) for p in _pool(gen))
    lens = [5, 2, 7]
    slots = torch.randperm(SLOTS, generator=gen)[: 3 * 12].view(3, 12)  # each request's slots, scattered in the pool
    batch_kv = BatchKV(k_pool, matmuls=matmuls)
    for step in range(4):
        seq_lens = torch.tensor(lens) + 1  # the new token included
        positions = seq_lens - 1
        width = int(seq_lens.max())
        table = slots[:, :width]
        new_k = torch.randn(3, KV_HEADS, DIM, generator=gen).to(dtype)
        new_v = torch.randn(3, KV_HEADS, DIM, generator=gen).to(dtype)
        q = torch.randn(3, HEADS, DIM, generator=gen).to(dtype)
        dense = batch_kv.view([10, 11, 12], capacity=12)
        assert dense.refill == (step == 0)
        for layer in range(LAYERS):
            new_slots = slots[torch.arange(3), positions]
            k_pool[layer, new_slots], v_pool[layer, new_slots] = new_k, new_v
            got = dense.attend(layer, q, new_k, new_v, k_pool[layer], v_pool[layer], table, positions, seq_lens, 0.3)
            want = reference.decode_attention(
                q.float(), k_pool[layer].float(), v_pool[layer].float(), table, seq_lens, 0.3
            )
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)
        lens = [n + 1 for n in lens]


def test_a_changed_batch_or_an_invalidation_refills_and_a_batch_too_large_reads_the_pool():
    k_pool, _ = _pool(torch.Generator().manual_seed(1))
    batch_kv = BatchKV(k_pool)
    assert batch_kv.view([1, 2], 10).refill
    assert not batch_kv.view([1, 2], 10).refill
    assert batch_kv.view([2, 1], 10).refill  # another order: other rows
    assert batch_kv.view([2, 1], 20).refill  # longer than the copy holds
    batch_kv.invalidate()
    assert batch_kv.view([2, 1], 20).refill
    assert batch_kv.view(list(range(5)), SLOTS) is None  # 5 x 64 tokens: more than the pool's 64
    token_bytes = 2 * LAYERS * KV_HEADS * DIM * 4
    assert BatchKV(k_pool, max_bytes=10 * token_bytes).view([1, 2], 6) is None  # 12 tokens over a 10-token bound


def test_an_engine_run_gives_the_same_logits_with_and_without_the_dense_copy():
    """Requests of several lengths, with and without LoRA adapters, under optimistic admission in a pool small
    enough to preempt: the batch changes many times (all arrive at once, so both runs schedule alike). Every
    request's logits at every step are those of the same run that gathers from the pool at each step."""
    runs = []
    for dense in (True, False):
        backend = tiny_backend(pool=300, adapters=dummies(2, 4))
        if not dense:
            backend.batch_kv = None
        logits = record_logits(backend)
        engine = real_engine(backend, pool=300, admission="optimistic")
        engine.memory._on_load = backend.load_adapter
        gen = torch.Generator().manual_seed(2)
        reqs = [
            request(
                [1] + torch.randint(3, 256, (5 + 7 * (i % 3),), generator=gen).tolist(),
                8 + 5 * (i % 4),
                client="abc"[i % 3],
                adapter=(None, "dummy-0", "dummy-1")[i % 3],
            )
            for i in range(12)
        ]
        engine.run(reqs)
        assert all(r.state is State.FINISHED for r in reqs)
        runs.append((reqs, logits, sum(r.preemptions for r in reqs)))
    (dense_reqs, dense_logits, preempted), (pool_reqs, pool_logits, _) = runs
    assert preempted > 0  # the batch lost requests mid-run, and they came back
    for a, b in zip(dense_reqs, pool_reqs):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(torch.stack(dense_logits[a.rid]), torch.stack(pool_logits[b.rid]), atol=1e-4, rtol=0)
