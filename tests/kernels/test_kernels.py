"""Triton kernels against their torch references, and the references against naive math.

On CPU the kernels run in the Triton interpreter (conftest sets TRITON_INTERPRET=1), so every shape
here is tiny. The `cuda` variants run the same checks on a GPU and are skipped without one; run them
compiled with `TRITON_INTERPRET=0 pytest tests/kernels/test_kernels.py` (the cpu variants then skip).
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
    pytest.param(
        "cpu",  # the Triton interpreter: slow
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(not INTERPRETED, reason="compiled Triton kernels need CUDA tensors"),
        ],
    ),
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


@pytest.mark.slow
def test_every_kernel_compiles_for_hopper_without_a_gpu():
    """GPU-only compile errors (tl.dot shapes, layouts, shared memory) that the interpreter cannot see."""
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this Triton build ships no ptxas")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {
        "TRITON_DEFAULT_FP_FUSION": "1"
    }
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


def inverse_frequencies(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    return theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaled", [False, True], ids=["default", "scaled"])
def test_rotary_embedding(device, dtype, scaled):
    """The kernel rotates by whatever frequencies it is given (a scaled RoPE's too)."""
    tokens, q_heads, kv_heads, head_dim = 7, 4, 2, 16
    qkv = rand(tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)  # views into a fused projection
    q = qkv[:, : q_heads * head_dim].view(tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.tensor([0, 1, 2, 40, 41, 300, 1023], device=device)
    inv_freq = inverse_frequencies(head_dim) * (torch.linspace(0.1, 1.0, head_dim // 2) if scaled else 1.0)
    inv_freq = inv_freq.to(device)
    for actual, expected in zip(
        triton_ops.rotary_embedding(q, k, positions, inv_freq), ref.rotary_embedding(q, k, positions, inv_freq)
    ):
        assert actual.shape == expected.shape and actual.dtype == dtype
        close(actual, expected, dtype)


def test_rotary_reference_rotates_pairs_half_a_dimension_apart():
    q = rand(3, 1, 8)
    positions = torch.tensor([0, 1, 5])
    rotated, _ = ref.rotary_embedding(q, q, positions, inverse_frequencies(8))
    torch.testing.assert_close(rotated[0], q[0])  # position 0 is the identity
    torch.testing.assert_close(rotated.norm(dim=-1), q.norm(dim=-1))  # a rotation keeps norms
    angle = 5 * 10000.0 ** (-2 * 1 / 8)  # pair (1, 5) at position 5
    x1, x2 = q[2, 0, 1], q[2, 0, 5]
    expected = torch.stack(
        [
            x1 * torch.cos(torch.tensor(angle)) - x2 * torch.sin(torch.tensor(angle)),
            x2 * torch.cos(torch.tensor(angle)) + x1 * torch.sin(torch.tensor(angle)),
        ]
    )
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
        qs, ks, vs = (
            t[s:e].float().transpose(0, 1) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
        )
        out[s:e] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1)
    return out


def test_prefill_reference_matches_sdpa_per_request():
    lengths, (q_heads, kv_heads), head_dim = [1, 6, 13], (6, 2), 16
    q, k, v = (
        rand(sum(lengths), q_heads, head_dim),
        rand(sum(lengths), kv_heads, head_dim),
        rand(sum(lengths), kv_heads, head_dim),
    )
    cu = cu_seqlens_of(lengths, "cpu")
    torch.testing.assert_close(ref.prefill_attention(q, k, v, cu, 0.25), sdpa_per_request(q, k, v, cu, 0.25))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
def test_prefill_attention(device, dtype, heads):
    lengths, head_dim = [1, 17, 33, 5], 16
    (q_heads, kv_heads), tokens = heads, sum(lengths)
    q = rand(tokens, q_heads, head_dim, dtype=dtype, device=device)
    k, v = (
        rand(tokens, kv_heads, head_dim, dtype=dtype, device=device),
        rand(tokens, kv_heads, head_dim, dtype=dtype, device=device),
    )
    cu = cu_seqlens_of(lengths, device)
    scale = head_dim**-0.5
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
    scale = 16**-0.5
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
    close(
        triton_ops.decode_attention(q, k_cache, v_cache, slot_table, seq_lens, 0.2, num_splits=4),
        expected,
        torch.float16,
    )


# ---------------------------------------------------------------- LoRA in the pool


class Adapters:
    """Random LoRA adapters of mixed ranks and targets, written into a pool exactly as reference.LoraRows
    documents the layout (by hand, slot by slot: independent of reference.lora_rows).

    projections: {name: (in_dim, out_dim)}; ranks: one {name: rank} per adapter (a missing name: not
    adapted). Each adapter's slot list holds its projections in its own order (so starts differ), each
    projection's rows over per_row = ceil(max(in_dim, out_dim) / width) slots, then padding up to the
    longest list. Every other slot is garbage: random, or NaN in K and inf in V (`nan_garbage`).
    """

    def __init__(self, projections, ranks, scales, kv_heads, head_dim, dtype, device, nan_garbage=False):
        width = kv_heads * head_dim
        self.projections, self.ranks, self.device = projections, ranks, device
        self.per_row = {p: -(-max(dims) // width) for p, dims in projections.items()}
        order = [
            [
                p
                for p in list(projections)[j % len(projections) :] + list(projections)[: j % len(projections)]
                if r.get(p)
            ]
            for j, r in enumerate(ranks)
        ]
        lengths = [sum(r[p] * self.per_row[p] for p in names) for names, r in zip(order, ranks)]
        pool_slots = sum(lengths) + 7
        used = scattered_slots(pool_slots, sum(lengths) + 1, "cpu")
        pad = int(used[-1])  # a garbage slot: where each shorter slot list's padding points
        self.slots = torch.full((len(ranks), max(lengths)), pad, dtype=torch.int64)
        self.starts = {p: torch.zeros(len(ranks), dtype=torch.int64) for p in projections}
        offset = 0
        for j, (names, length) in enumerate(zip(order, lengths)):
            self.slots[j, :length] = used[offset : offset + length]
            offset += length
            start = 0
            for p in names:
                self.starts[p][j] = start
                start += ranks[j][p] * self.per_row[p]
        fill = (float("nan"), float("inf")) if nan_garbage else (None, None)
        self.k_cache, self.v_cache = (
            rand(pool_slots, kv_heads, head_dim) if f is None else torch.full((pool_slots, kv_heads, head_dim), f)
            for f in fill
        )
        self.a = [{p: rand(r, projections[p][0]) for p, r in adapter.items() if r} for adapter in ranks]  # A: [r, in]
        self.b = [
            {p: rand(projections[p][1], r) * 0.5 for p, r in adapter.items() if r} for adapter in ranks
        ]  # B: [out, r]
        for j in range(len(ranks)):
            for p, a in self.a[j].items():
                for i in range(a.shape[0]):
                    self._write(self.k_cache, j, p, i, a[i])
                    self._write(self.v_cache, j, p, i, self.b[j][p][:, i])
        self.k_cache, self.v_cache = (
            self.k_cache.to(dtype=dtype, device=device),
            self.v_cache.to(dtype=dtype, device=device),
        )
        self.scales = torch.tensor(scales, dtype=torch.float32)

    def _write(self, cache, adapter, proj, row, values):
        flat = cache.view(cache.shape[0], -1)
        width = flat.shape[1]
        first = int(self.starts[proj][adapter]) + row * self.per_row[proj]
        for c in range(self.per_row[proj]):
            piece = values[c * width : (c + 1) * width]
            flat[self.slots[adapter, first + c], : len(piece)] = piece

    def rank(self, adapter: int, proj: str) -> int:
        return self.ranks[adapter].get(proj, 0)

    def rows(self, proj: str) -> ref.LoraRows:
        ranks = torch.tensor([self.rank(j, proj) for j in range(len(self.ranks))])
        return ref.LoraRows(
            slots=self.slots.to(self.device),
            starts=self.starts[proj].to(self.device),
            ranks=ranks.to(self.device),
            scales=self.scales.to(self.device),
            max_rank=int(ranks.max()),
            per_row=self.per_row[proj],
        )

    def naive(self, x, adapter_ids, proj):
        """(y, delta) per token in fp32 from the plain A and B: y = x @ A.T (zero past the rank),
        delta = scale * y @ B.T."""
        out_dim = self.projections[proj][1]
        y = torch.zeros(x.shape[0], max(self.rank(j, proj) for j in range(len(self.ranks))))
        delta = torch.zeros(x.shape[0], out_dim)
        for t, j in enumerate(adapter_ids.tolist()):
            if j >= 0 and self.rank(j, proj):
                r = self.rank(j, proj)
                y[t, :r] = x[t].float().cpu() @ self.a[j][proj].T
                delta[t] = self.scales[j] * (y[t, :r] @ self.b[j][proj].T)
        return y, delta


# (projections, kv_heads, head_dim): an MLP with in_dim != out_dim and rows over 2 and 3 slots (slot
# width 32 < row), plus a projection no adapter adapts; then one slot per row
LORA_SETUPS = [
    ({"q": (64, 64), "up": (64, 96), "down": (96, 64), "o": (64, 64)}, 1, 32),
    ({"q": (32, 32), "up": (32, 32), "down": (32, 32)}, 2, 16),
]
LORA_RANKS = [
    {"q": 4, "up": 8, "down": 8},
    {"q": 16, "down": 4},
    {"q": 8, "up": 16},
]  # ranks 4, 8, 16; some targets missing
LORA_SCALES = [0.5, 2.0, 0.125]
TOKEN_ADAPTERS = [2, -1, 0, 2, 1, -1, 1]


def lora_case(setup, dtype, device, nan_garbage=False) -> Adapters:
    projections, kv_heads, head_dim = setup
    return Adapters(projections, LORA_RANKS, LORA_SCALES, kv_heads, head_dim, dtype, device, nan_garbage=nan_garbage)


def untouched_tokens(lora: Adapters, adapter_ids: list[int], proj: str) -> list[int]:
    return [t for t, j in enumerate(adapter_ids) if j < 0 or lora.rank(j, proj) == 0]


@pytest.mark.parametrize("nan_garbage", [False, True])
@pytest.mark.parametrize("setup", LORA_SETUPS)
def test_lora_reference_matches_x_at_a_t_at_b_t(setup, nan_garbage):
    lora = lora_case(setup, torch.float32, "cpu", nan_garbage)
    ids = torch.tensor(TOKEN_ADAPTERS)
    for proj, (in_dim, out_dim) in lora.projections.items():
        x = rand(len(ids), in_dim)
        want_y, want_delta = lora.naive(x, ids, proj)
        y = ref.lora_shrink(x, lora.k_cache, lora.rows(proj), ids)
        assert y.dtype == torch.float32
        torch.testing.assert_close(y, want_y, atol=1e-4, rtol=1e-4)
        base = rand(len(ids), out_dim)
        out = base.clone()
        ref.lora_expand(y, lora.v_cache, lora.rows(proj), ids, out)
        torch.testing.assert_close(out, base + want_delta, atol=1e-4, rtol=1e-4)
        for t in untouched_tokens(lora, TOKEN_ADAPTERS, proj):
            assert torch.equal(out[t], base[t])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("setup", LORA_SETUPS)
def test_lora_shrink_and_expand_per_token(device, dtype, setup):
    lora = lora_case(setup, dtype, device)
    ids = torch.tensor(TOKEN_ADAPTERS, device=device)
    for proj, (in_dim, out_dim) in lora.projections.items():
        rows = lora.rows(proj)
        x = rand(len(ids), in_dim, dtype=dtype, device=device)
        y = triton_ops.lora_shrink(x, lora.k_cache, rows, ids)
        assert y.shape == (len(ids), rows.max_rank) and y.dtype == torch.float32
        close(y, ref.lora_shrink(x, lora.k_cache, rows, ids), dtype)
        base = rand(len(ids), out_dim, dtype=dtype, device=device)
        actual, expected = base.clone(), base.clone()
        triton_ops.lora_expand(y, lora.v_cache, rows, ids, actual)
        ref.lora_expand(y, lora.v_cache, rows, ids, expected)
        close(actual, expected, dtype)
        for t in untouched_tokens(lora, TOKEN_ADAPTERS, proj):  # no adapter, or rank 0 here
            assert torch.equal(actual[t], base[t]) and not y[t].any()


SEGMENTS = ([5, 17, 1, 9, 3, 4], [1, -1, 0, 2, 1, 2])  # ragged lengths, adapter per request


def segment_token_ids(device) -> torch.Tensor:
    lengths, adapters = SEGMENTS
    return torch.tensor([a for n, a in zip(lengths, adapters) for _ in range(n)], device=device)


def test_lora_segment_references_match_per_token_ids():
    lora = lora_case(LORA_SETUPS[0], torch.float32, "cpu")
    lengths, adapters = SEGMENTS
    cu, seg, ids = cu_seqlens_of(lengths, "cpu"), torch.tensor(adapters), segment_token_ids("cpu")
    for proj in ("up", "down"):
        in_dim, out_dim = lora.projections[proj]
        x = rand(sum(lengths), in_dim)
        y = ref.lora_shrink_segments(x, lora.k_cache, lora.rows(proj), cu, seg)
        torch.testing.assert_close(y, ref.lora_shrink(x, lora.k_cache, lora.rows(proj), ids))
        out = torch.zeros(sum(lengths), out_dim)
        ref.lora_expand_segments(y, lora.v_cache, lora.rows(proj), cu, seg, out, max_seqlen=max(lengths))
        torch.testing.assert_close(out, lora.naive(x, ids, proj)[1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("setup", LORA_SETUPS)
def test_lora_shrink_and_expand_segments(device, dtype, setup):
    lora = lora_case(setup, dtype, device)
    lengths, adapters = SEGMENTS
    cu, seg = cu_seqlens_of(lengths, device), torch.tensor(adapters, device=device)
    ids = segment_token_ids("cpu").tolist()
    for n, (proj, (in_dim, out_dim)) in enumerate(lora.projections.items()):
        rows = lora.rows(proj)
        max_seqlen = max(lengths) if n % 2 else None  # given by the host, or read from cu_seqlens
        x = rand(sum(lengths), in_dim, dtype=dtype, device=device)
        y = triton_ops.lora_shrink_segments(x, lora.k_cache, rows, cu, seg, max_seqlen=max_seqlen)
        assert y.shape == (sum(lengths), rows.max_rank)
        close(y, ref.lora_shrink_segments(x, lora.k_cache, rows, cu, seg), dtype)
        base = rand(sum(lengths), out_dim, dtype=dtype, device=device)
        actual, expected = base.clone(), base.clone()
        triton_ops.lora_expand_segments(y, lora.v_cache, rows, cu, seg, actual, max_seqlen=max_seqlen)
        ref.lora_expand_segments(y, lora.v_cache, rows, cu, seg, expected)
        close(actual, expected, dtype)
        for t in untouched_tokens(lora, ids, proj):
            assert torch.equal(actual[t], base[t]) and not y[t].any()


@pytest.mark.parametrize("device", DEVICES)
def test_lora_ignores_nan_and_inf_outside_the_adapters_rows(device):
    """Slots past an adapter's rank (padding, other projections' rows) may be never-written pool slots."""
    lora = lora_case(LORA_SETUPS[0], torch.float16, device, nan_garbage=True)
    lengths, adapters = SEGMENTS
    cu, seg, ids = cu_seqlens_of(lengths, device), torch.tensor(adapters, device=device), segment_token_ids(device)
    for proj in ("up", "down"):
        rows = lora.rows(proj)
        in_dim, out_dim = lora.projections[proj]
        x = rand(sum(lengths), in_dim, dtype=torch.float16, device=device)
        expected_y = ref.lora_shrink(x, lora.k_cache, rows, ids)
        expected = torch.zeros(sum(lengths), out_dim, dtype=torch.float16, device=device)
        ref.lora_expand(expected_y, lora.v_cache, rows, ids, expected)
        assert torch.isfinite(expected).all()
        for y in (
            triton_ops.lora_shrink(x, lora.k_cache, rows, ids),
            triton_ops.lora_shrink_segments(x, lora.k_cache, rows, cu, seg),
        ):
            close(y, expected_y, torch.float16)
        per_token, segments = torch.zeros_like(expected), torch.zeros_like(expected)
        triton_ops.lora_expand(expected_y, lora.v_cache, rows, ids, per_token)
        triton_ops.lora_expand_segments(expected_y, lora.v_cache, rows, cu, seg, segments)
        close(per_token, expected, torch.float16)
        close(segments, expected, torch.float16)
