"""Extend attention (prefill over a cached prefix): the reference against full causal attention over the
whole context, the torch ops and the Triton kernel against the reference.

On CPU the Triton kernel runs in the interpreter (TRITON_INTERPRET=1, set before any kernel is
defined), so every shape here is tiny; the `cuda` variants run on a GPU and skip without one.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from slora_vtc.model.torch_ops import TorchOps  # noqa: E402
from slora_vtc_kernels import ops  # noqa: E402
from slora_vtc_kernels import reference as ref  # noqa: E402
from slora_vtc_kernels._launch import interpreted  # noqa: E402
from slora_vtc_kernels.extend_attention import _extend_kernel  # noqa: E402

triton_ops = ops("triton")
DEVICES = [
    pytest.param(
        "cpu",  # the Triton interpreter: slow
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(not interpreted(_extend_kernel), reason="compiled Triton kernels need CUDA tensors"),
        ],
    ),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
GQA = [(4, 4), (4, 2), (6, 2)]  # (query heads, KV heads)
# (cached, new) per request: a cold one, a mid-block prefix, one new token, a prefix and extension
# both over one 16-row block
CASES = [(0, 5), (9, 3), (3, 1), (21, 18)]
POOL_SLOTS = 128


def extend_case(cases, q_heads, kv_heads, head_dim=16, dtype=torch.float32, device="cpu", seed=0):
    """New tokens' queries, a random pool, and a slot table of scattered, distinct slots per request."""
    gen = torch.Generator().manual_seed(seed)
    new = [n for _, n in cases]
    q = torch.randn(sum(new), q_heads, head_dim, generator=gen)
    k_cache, v_cache = torch.randn(2, POOL_SLOTS, kv_heads, head_dim, generator=gen)
    width = max(c + n for c, n in cases)
    order = torch.randperm(POOL_SLOTS, generator=gen)
    table = torch.zeros(len(cases), width, dtype=torch.int64)
    used = 0
    for b, (c, n) in enumerate(cases):
        table[b, : c + n] = order[used : used + c + n]
        used += c + n
    cu = torch.tensor([0, *new]).cumsum(0)
    cached = torch.tensor([c for c, _ in cases])
    to = dict(device=device)
    return (
        q.to(dtype=dtype, **to),
        k_cache.to(dtype=dtype, **to),
        v_cache.to(dtype=dtype, **to),
        cu.to(**to),
        table.to(**to),
        cached.to(**to),
    )


def test_reference_is_the_tail_of_causal_attention_over_the_whole_context():
    """Request b's new rows equal rows cached..ctx of ordinary causal prefill over its whole context."""
    q, k_cache, v_cache, cu, table, cached = extend_case(CASES, 6, 2)
    out = ref.extend_attention(q, k_cache, v_cache, cu, table, cached, 0.3)
    gen = torch.Generator().manual_seed(1)
    for b, (c, n) in enumerate(CASES):
        slots = table[b, : c + n]
        q_full = torch.cat(
            [torch.randn(c, 6, 16, generator=gen), q[cu[b] : cu[b + 1]]]
        )  # the prefix's own queries are irrelevant
        full = ref.prefill_attention(q_full, k_cache[slots], v_cache[slots], torch.tensor([0, c + n]), 0.3)
        torch.testing.assert_close(out[cu[b] : cu[b + 1]], full[c:])


def test_reference_by_hand_on_one_query():
    """One new token after two cached ones: softmax over all three keys, weights worked out directly."""
    q = torch.tensor([[[1.0, 0.0]]])  # [1 token, 1 head, D=2]
    k_cache = torch.tensor([[[0.0, 0.0]], [[2.0, 0.0]], [[1.0, 5.0]], [[9.0, 9.0]]])  # slot 3 is not in the context
    v_cache = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]], [[50.0, 50.0]]])
    out = ref.extend_attention(
        q, k_cache, v_cache, torch.tensor([0, 1]), torch.tensor([[0, 1, 2, 3]]), torch.tensor([2]), 1.0
    )
    w = torch.tensor([0.0, 2.0, 1.0]).softmax(0)  # scores q . k for slots 0, 1, 2
    torch.testing.assert_close(out[0, 0], torch.stack([w[0] + w[2], w[1] + w[2]]))


@pytest.mark.parametrize("heads", GQA)
def test_torch_ops_match_the_reference(heads):
    q, k_cache, v_cache, cu, table, cached = extend_case(CASES, *heads)
    expected = ref.extend_attention(q, k_cache, v_cache, cu, table, cached, 0.25)
    torch.testing.assert_close(TorchOps.extend_attention(q, k_cache, v_cache, cu, table, cached, 0.25), expected)


def close(actual, expected, dtype):
    torch.testing.assert_close(
        actual.float().cpu(), expected.float().cpu(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", GQA)
def test_triton_matches_the_reference(device, dtype, heads):
    q, k_cache, v_cache, cu, table, cached = extend_case(CASES, *heads, dtype=dtype, device=device)
    expected = ref.extend_attention(q, k_cache, v_cache, cu, table, cached, 0.25)
    close(triton_ops.extend_attention(q, k_cache, v_cache, cu, table, cached, 0.25), expected, dtype)
    close(triton_ops.extend_attention(q, k_cache, v_cache, cu, table, cached, 0.25, max_seqlen=18), expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_triton_without_a_cached_prefix_is_prefill(device):
    """cached_len 0 everywhere, contiguous slots: the same numbers as the prefill kernel."""
    lengths = [7, 20]
    q, k_cache, v_cache, cu, _, _ = extend_case([(0, n) for n in lengths], 4, 2, device=device)
    table = torch.stack([torch.arange(20), torch.arange(7, 27)]).to(device)
    out = triton_ops.extend_attention(
        q, k_cache, v_cache, cu, table, torch.zeros(2, dtype=torch.int64, device=device), 0.25
    )
    close(out, triton_ops.prefill_attention(q, k_cache[:27], v_cache[:27], cu, 0.25), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_triton_ignores_slots_outside_each_context(device):
    """Pool slots no context names (and table entries past a context) may hold NaN/inf: never read."""
    q, k_cache, v_cache, cu, table, cached = extend_case(CASES, 4, 2, device=device)
    live = torch.zeros(POOL_SLOTS, dtype=torch.bool)
    for b, (c, n) in enumerate(CASES):
        live[table[b, : c + n].cpu()] = True
    k_cache[~live.to(device)] = float("nan")
    v_cache[~live.to(device)] = float("inf")
    table[0, 5:] = int(torch.nonzero(~live)[0])  # request 0's table past its context points at a NaN slot
    expected = ref.extend_attention(q, k_cache, v_cache, cu, table, cached, 0.25)
    assert torch.isfinite(expected).all()
    close(triton_ops.extend_attention(q, k_cache, v_cache, cu, table, cached, 0.25), expected, torch.float32)
