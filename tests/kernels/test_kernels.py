"""Triton kernels against their torch references, and the references against naive math.

On CPU the kernels run in the Triton interpreter (conftest sets TRITON_INTERPRET=1), so every shape
here is tiny. The `cuda` variants run the same checks on a GPU and are skipped without one; run them
compiled with `TRITON_INTERPRET=0 pytest tests/test_kernels.py` (the cpu variants then skip).
"""

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from slora_vtc_kernels import BACKENDS, OP_NAMES, ops  # noqa: E402
from slora_vtc_kernels import reference as ref  # noqa: E402
from slora_vtc_kernels._launch import interpreted  # noqa: E402
from slora_vtc_kernels.rmsnorm import _rms_norm_kernel  # noqa: E402

triton_ops = ops("triton")
INTERPRETED = interpreted(_rms_norm_kernel)  # how the kernels were defined (TRITON_INTERPRET at import)

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="compiled Triton kernels need CUDA tensors")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
GQA = [(4, 4), (4, 2), (6, 2)]  # (query heads, KV heads)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), atol=tol, rtol=tol)


def rand(*shape, dtype=torch.float32, device="cpu", seed: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


def cu_seqlens_of(lengths: list[int], device) -> torch.Tensor:
    return torch.tensor([0] + lengths, device=device).cumsum(0)


def scattered_slots(pool_slots: int, n: int, device) -> torch.Tensor:
    return torch.randperm(pool_slots)[:n].to(device)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------- the ops() entry point

def test_ops_sets_have_every_op_with_matching_signatures():
    import inspect

    reference_ops = ops("reference")
    for name in OP_NAMES:
        ref_params = list(inspect.signature(getattr(reference_ops, name)).parameters)
        tri_params = list(inspect.signature(getattr(triton_ops, name)).parameters)
        assert tri_params[: len(ref_params)] == ref_params, name


def test_ops_rejects_unknown_names():
    with pytest.raises(ValueError, match="reference, triton"):
        ops("cuda")
    assert BACKENDS == ("reference", "triton")


def test_every_kernel_compiles_for_hopper_without_a_gpu():
    """GPU-only compile errors (tl.dot shapes, layouts, shared memory) that the interpreter cannot see."""
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this Triton build ships no ptxas")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    command = [sys.executable, "-m", "slora_vtc_kernels.compile_check", "--arch", "90", "--dtypes", "fp16"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- elementwise kernels

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(device, dtype):
    x = rand(5, 2 * 96, dtype=dtype, device=device)[:, :96]  # strided rows, width not a power of two
    weight = rand(96, dtype=dtype, device=device)
    close(triton_ops.rms_norm(x, weight, 1e-6), ref.rms_norm(x, weight, 1e-6), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding(device, dtype):
    tokens, q_heads, kv_heads, head_dim = 7, 4, 2, 16
    qkv = rand(tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)  # views into a fused projection
    q = qkv[:, : q_heads * head_dim].view(tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.tensor([0, 1, 2, 40, 41, 300, 1023], device=device)
    for actual, expected in zip(triton_ops.rotary_embedding(q, k, positions, 10000.0), ref.rotary_embedding(q, k, positions, 10000.0)):
        assert actual.shape == expected.shape and actual.dtype == dtype
        close(actual, expected, dtype)


def test_rotary_reference_rotates_pairs_half_a_dimension_apart():
    q = rand(3, 1, 8)
    positions = torch.tensor([0, 1, 5])
    rotated, _ = ref.rotary_embedding(q, q, positions, 10000.0)
    torch.testing.assert_close(rotated[0], q[0])  # position 0 is the identity
    torch.testing.assert_close(rotated.norm(dim=-1), q.norm(dim=-1))  # a rotation keeps norms
    angle = 5 * 10000.0 ** (-2 * 1 / 8)  # pair (1, 5) at position 5
    x1, x2 = q[2, 0, 1], q[2, 0, 5]
    expected = torch.stack([x1 * torch.cos(torch.tensor(angle)) - x2 * torch.sin(torch.tensor(angle)),
                            x2 * torch.cos(torch.tensor(angle)) + x1 * torch.sin(torch.tensor(angle))])
    torch.testing.assert_close(rotated[2, 0, [1, 5]], expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_scatter_writes_only_the_given_slots(device, dtype):
    pool_slots, tokens, kv_heads, head_dim = 40, 9, 2, 16
    slots = scattered_slots(pool_slots, tokens, device)
    for kv_dtype in (dtype, torch.float32):  # the cache's dtype (a copy), then fp32 rows rounded on the way in
        k = rand(tokens, kv_heads, head_dim, dtype=kv_dtype, device=device)
        v = rand(tokens, 2 * kv_heads, head_dim, dtype=kv_dtype, device=device)[:, kv_heads:]  # strided rows
        caches = [rand(pool_slots, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(2)]
        expected = [c.clone() for c in caches]
        triton_ops.kv_scatter(k, v, *caches, slots)
        ref.kv_scatter(k, v, *expected, slots)
        for actual, want in zip(caches, expected):
            if kv_dtype == dtype:
                assert torch.equal(actual.cpu(), want.cpu())
            else:  # the interpreter rounds fp32 -> bf16 toward zero, a GPU to nearest
                close(actual, want, dtype)
            untouched = torch.ones(pool_slots, dtype=torch.bool)
            untouched[slots.cpu()] = False
            assert torch.equal(actual.cpu()[untouched], want.cpu()[untouched])


# ---------------------------------------------------------------- attention

def sdpa_per_request(q, k, v, cu_seqlens, scale):
    """Naive truth: torch's causal scaled_dot_product_attention on each request separately."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q, dtype=torch.float32)
    for b in range(len(cu_seqlens) - 1):
        s, e = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        qs, ks, vs = (t[s:e].float().transpose(0, 1) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
        out[s:e] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1)
    return out


def test_prefill_reference_matches_sdpa_per_request():
    lengths, (q_heads, kv_heads), head_dim = [1, 6, 13], (6, 2), 16
    q, k, v = rand(sum(lengths), q_heads, head_dim), rand(sum(lengths), kv_heads, head_dim), rand(sum(lengths), kv_heads, head_dim)
    cu = cu_seqlens_of(lengths, "cpu")
    torch.testing.assert_close(ref.prefill_attention(q, k, v, cu, 0.25), sdpa_per_request(q, k, v, cu, 0.25))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
def test_prefill_attention(device, dtype, heads):
    lengths, head_dim = [1, 17, 33, 5], 16
    (q_heads, kv_heads), tokens = heads, sum(lengths)
    q = rand(tokens, q_heads, head_dim, dtype=dtype, device=device)
    k, v = rand(tokens, kv_heads, head_dim, dtype=dtype, device=device), rand(tokens, kv_heads, head_dim, dtype=dtype, device=device)
    cu = cu_seqlens_of(lengths, device)
    scale = head_dim ** -0.5
    expected = ref.prefill_attention(q, k, v, cu, scale)
    close(triton_ops.prefill_attention(q, k, v, cu, scale), expected, dtype)
    close(triton_ops.prefill_attention(q, k, v, cu, scale, max_seqlen=max(lengths)), expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_attention_head_dim_32_strided_q(device):
    lengths, q_heads, kv_heads, head_dim = [20, 3], 2, 1, 32
    qkv = rand(sum(lengths), (q_heads + 2 * kv_heads) * head_dim, dtype=torch.float16, device=device)
    q = qkv[:, : q_heads * head_dim].view(-1, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim].view(-1, kv_heads, head_dim)
    v = qkv[:, (q_heads + kv_heads) * head_dim :].view(-1, kv_heads, head_dim)
    cu = cu_seqlens_of(lengths, device)
    close(triton_ops.prefill_attention(q, k, v, cu, 0.2), ref.prefill_attention(q, k, v, cu, 0.2), torch.float16)


def decode_case(batch_lens, q_heads, kv_heads, head_dim, dtype, device, pool_slots=256):
    """q, pool, a slot table of scattered slots (entries past each length point at other live slots)."""
    max_len = max(batch_lens)
    q = rand(len(batch_lens), q_heads, head_dim, dtype=dtype, device=device)
    k_cache = rand(pool_slots, kv_heads, head_dim, dtype=dtype, device=device)
    v_cache = rand(pool_slots, kv_heads, head_dim, dtype=dtype, device=device)
    slot_table = torch.stack([scattered_slots(pool_slots, max_len, device) for _ in batch_lens])
    return q, k_cache, v_cache, slot_table, torch.tensor(batch_lens, device=device)


def test_decode_reference_matches_full_attention():
    q, k_cache, v_cache, slot_table, seq_lens = decode_case([1, 9, 20], 6, 2, 16, torch.float32, "cpu")
    out = ref.decode_attention(q, k_cache, v_cache, slot_table, seq_lens, 0.3)
    for b, length in enumerate(seq_lens.tolist()):
        keys = k_cache[slot_table[b, :length]].repeat_interleave(3, dim=1)  # [L, Hq, D]
        values = v_cache[slot_table[b, :length]].repeat_interleave(3, dim=1)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[b], keys) * 0.3, dim=-1)
        torch.testing.assert_close(out[b], torch.einsum("hl,lhd->hd", weights, values))


def test_decode_reference_is_the_last_row_of_prefill():
    lengths = [4, 11]
    q, k, v = rand(15, 4, 16), rand(15, 2, 16), rand(15, 2, 16)
    cu = cu_seqlens_of(lengths, "cpu")
    prefill = ref.prefill_attention(q, k, v, cu, 0.25)
    last = cu[1:] - 1
    slot_table = torch.stack([torch.arange(11), torch.arange(4, 15)])  # request 0 lives in slots 0..3
    out = ref.decode_attention(q[last], k, v, slot_table, torch.tensor(lengths), 0.25)
    torch.testing.assert_close(out, prefill[last])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_decode_attention(device, dtype, heads, num_splits):
    q, k_cache, v_cache, slot_table, seq_lens = decode_case([1, 37, 64], *heads, 16, dtype, device)
    scale = 16 ** -0.5
    actual = triton_ops.decode_attention(q, k_cache, v_cache, slot_table, seq_lens, scale, num_splits=num_splits)
    close(actual, ref.decode_attention(q, k_cache, v_cache, slot_table, seq_lens, scale), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_attention_ignores_garbage_past_each_length(device):
    q, k_cache, v_cache, slot_table, seq_lens = decode_case([3, 30], 4, 2, 16, torch.float32, device, pool_slots=64)
    live = torch.zeros(64, dtype=torch.bool)
    for b, length in enumerate(seq_lens.tolist()):
        live[slot_table[b, :length].cpu()] = True
    k_cache[~live.to(device)] = float("nan")  # never-written slots of a torch.empty pool
    v_cache[~live.to(device)] = float("inf")
    expected = ref.decode_attention(q, k_cache, v_cache, slot_table, seq_lens, 0.25)
    assert torch.isfinite(expected).all()
    close(triton_ops.decode_attention(q, k_cache, v_cache, slot_table, seq_lens, 0.25), expected, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_attention_int32_tables_strided_q_head_dim_32(device):
    q, k_cache, v_cache, slot_table, seq_lens = decode_case([5, 50], 4, 2, 32, torch.float16, device)
    q = torch.cat([q, q], dim=-1)[..., :32]  # strided rows
    slot_table, seq_lens = slot_table.to(torch.int32), seq_lens.to(torch.int32)
    expected = ref.decode_attention(q, k_cache, v_cache, slot_table.long(), seq_lens.long(), 0.2)
    close(triton_ops.decode_attention(q, k_cache, v_cache, slot_table, seq_lens, 0.2, num_splits=4), expected, torch.float16)


# ---------------------------------------------------------------- LoRA in the pool

RANK = 4


class Adapters:
    """Random LoRA adapters written into a pool exactly as reference.lora_rows documents the layout."""

    def __init__(self, count, in_dim, out_dim, kv_heads, head_dim, dtype, device, rank=RANK, pool_slots=200):
        width = kv_heads * head_dim
        self.per_row = -(-max(in_dim, out_dim) // width)
        self.k_cache = rand(pool_slots, kv_heads, head_dim, dtype=dtype, device=device)  # garbage around the adapters
        self.v_cache = rand(pool_slots, kv_heads, head_dim, dtype=dtype, device=device)
        self.lora_slots = scattered_slots(pool_slots, count * 4 * rank * self.per_row, device).view(count, -1)
        self.a = [rand(4, rank, in_dim, dtype=dtype) for _ in range(count)]  # A_p: [r, in]
        self.b = [rand(4, out_dim, rank, dtype=dtype) * 0.5 for _ in range(count)]  # B_p: [out, r]
        for j in range(count):
            for p in range(4):
                for i in range(rank):
                    self._write(self.k_cache, j, p * rank + i, self.a[j][p, i], rank)
                    self._write(self.v_cache, j, p * rank + i, self.b[j][p, :, i], rank)

    def _write(self, cache, adapter, row, values, rank):
        flat = cache.view(cache.shape[0], -1)
        width = flat.shape[1]
        for c in range(self.per_row):
            piece = values[c * width : (c + 1) * width]
            flat[self.lora_slots[adapter, row * self.per_row + c], : len(piece)] = piece.to(cache.device)

    def naive(self, x, adapter_ids, proj, scale):
        """scale * x @ A.T @ B.T per token, in fp32."""
        out = torch.zeros(x.shape[0], self.b[0].shape[1])
        for t, j in enumerate(adapter_ids.tolist()):
            if j >= 0:
                out[t] = scale * (x[t].float().cpu() @ self.a[j][proj].float().T @ self.b[j][proj].float().T)
        return out


# (in_dim, out_dim, kv_heads, head_dim): one slot per row; rows over 2 and 3 slots (GQA pools)
LORA_SHAPES = [(32, 32, 2, 16), (64, 32, 2, 16), (48, 80, 1, 32)]


def test_lora_reference_matches_x_at_a_t_at_b_t():
    lora = Adapters(3, 48, 80, 1, 32, torch.float32, "cpu")
    x, ids = rand(5, 48), torch.tensor([2, -1, 0, 1, 2])
    for proj in range(4):
        y = ref.lora_shrink(x, lora.k_cache, lora.lora_slots, ids, proj, RANK)
        out = torch.zeros(5, 80)
        ref.lora_expand(y, lora.v_cache, lora.lora_slots, ids, proj, RANK, out, 0.5)
        torch.testing.assert_close(out, lora.naive(x, ids, proj, 0.5), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", LORA_SHAPES)
def test_lora_shrink_and_expand_per_token(device, dtype, shape):
    in_dim, out_dim, kv_heads, head_dim = shape
    lora = Adapters(3, in_dim, out_dim, kv_heads, head_dim, dtype, device)
    x = rand(6, in_dim, dtype=dtype, device=device)
    ids = torch.tensor([2, -1, 0, 2, 1, -1], device=device)
    for proj in (0, 3):
        y = triton_ops.lora_shrink(x, lora.k_cache, lora.lora_slots, ids, proj, RANK)
        close(y, ref.lora_shrink(x, lora.k_cache, lora.lora_slots, ids, proj, RANK), dtype)
        base = rand(6, out_dim, dtype=dtype, device=device)
        actual, expected = base.clone(), base.clone()
        triton_ops.lora_expand(y, lora.v_cache, lora.lora_slots, ids, proj, RANK, actual, 0.5)
        ref.lora_expand(y, lora.v_cache, lora.lora_slots, ids, proj, RANK, expected, 0.5)
        close(actual, expected, dtype)
        assert torch.equal(actual[1], base[1]) and torch.equal(actual[5], base[5])  # no adapter: untouched


SEGMENTS = ([5, 17, 1, 9], [1, -1, 0, 1])  # lengths, adapter per request


def test_lora_segment_references_match_per_token_ids():
    lora = Adapters(2, 64, 32, 2, 16, torch.float32, "cpu")
    lengths, adapters = SEGMENTS
    cu, seg = cu_seqlens_of(lengths, "cpu"), torch.tensor(adapters)
    ids = torch.tensor([a for n, a in zip(lengths, adapters) for _ in range(n)])
    x = rand(sum(lengths), 64)
    y = ref.lora_shrink_segments(x, lora.k_cache, lora.lora_slots, cu, seg, 1, RANK)
    torch.testing.assert_close(y, ref.lora_shrink(x, lora.k_cache, lora.lora_slots, ids, 1, RANK))
    out = torch.zeros(sum(lengths), 32)
    ref.lora_expand_segments(y, lora.v_cache, lora.lora_slots, cu, seg, 1, RANK, out, 2.0)
    torch.testing.assert_close(out, lora.naive(x, ids, 1, 2.0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", LORA_SHAPES)
def test_lora_shrink_and_expand_segments(device, dtype, shape):
    in_dim, out_dim, kv_heads, head_dim = shape
    lora = Adapters(2, in_dim, out_dim, kv_heads, head_dim, dtype, device)
    lengths, adapters = SEGMENTS
    cu, seg = cu_seqlens_of(lengths, device), torch.tensor(adapters, device=device)
    x = rand(sum(lengths), in_dim, dtype=dtype, device=device)
    y = triton_ops.lora_shrink_segments(x, lora.k_cache, lora.lora_slots, cu, seg, 2, RANK)
    close(y, ref.lora_shrink_segments(x, lora.k_cache, lora.lora_slots, cu, seg, 2, RANK), dtype)
    base = rand(sum(lengths), out_dim, dtype=dtype, device=device)
    actual, expected = base.clone(), base.clone()
    triton_ops.lora_expand_segments(y, lora.v_cache, lora.lora_slots, cu, seg, 2, RANK, actual, 0.5, max_seqlen=17)
    ref.lora_expand_segments(y, lora.v_cache, lora.lora_slots, cu, seg, 2, RANK, expected, 0.5)
    close(actual, expected, dtype)
    untouched = slice(5, 22)  # the request without an adapter
    assert torch.equal(actual[untouched], base[untouched])


@pytest.mark.parametrize("device", DEVICES)
def test_lora_rank_16(device):
    lora = Adapters(2, 32, 32, 2, 16, torch.float16, device, rank=16, pool_slots=300)
    lengths, adapters = [3, 20], [1, 0]
    cu, seg = cu_seqlens_of(lengths, device), torch.tensor(adapters, device=device)
    x = rand(23, 32, dtype=torch.float16, device=device)
    y = triton_ops.lora_shrink_segments(x, lora.k_cache, lora.lora_slots, cu, seg, 3, 16)
    close(y, ref.lora_shrink_segments(x, lora.k_cache, lora.lora_slots, cu, seg, 3, 16), torch.float16)
    ids = torch.tensor([1, 0, -1], device=device)
    close(triton_ops.lora_shrink(x[:3], lora.k_cache, lora.lora_slots, ids, 3, 16),
          ref.lora_shrink(x[:3], lora.k_cache, lora.lora_slots, ids, 3, 16), torch.float16)
