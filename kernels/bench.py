"""GPU micro-benchmark of the Triton attention kernels on Llama-7B-like shapes.

    python -m slora_vtc_kernels.bench --out bench.json [--peak-gbps 4800] [--no-sweep]

decode_attention: achieved bandwidth = bytes of K and V read (sum of seq_lens * Hk * D * 2 bytes * 2)
/ kernel time (CUDA events, after warm-up), with slots scattered at random over the pool; also a
small sweep of tile configurations and split counts, to pick defaults on a new GPU.
prefill_attention: prompt tokens per second (and attention TFLOP/s), next to torch's
scaled_dot_product_attention on the same padded-free uniform batch when there is one.
extend_attention: new tokens per second of prefills over a cached prefix (K/V read through a slot
table of scattered slots), next to a cold prefill of the same new tokens.
Each case also records its max error against the torch reference. Prints JSON; writes it to --out.
On a machine without CUDA it prints why it is skipped and exits 0.
"""

import argparse
import json
import os
import sys

import torch

DECODE_CASES = [  # name, batch, context, query heads, KV heads
    ("llama7b_b64_ctx1024", 64, 1024, 32, 32),
    ("llama7b_b16_ctx4096", 16, 4096, 32, 32),
    ("gqa_hk8_b64_ctx1024", 64, 1024, 32, 8),
]
PREFILL_CASES = [  # name, prompt lengths
    ("prefill_16x512", [512] * 16),
    ("prefill_4x2048", [2048] * 4),
    ("prefill_ragged_32", None),  # 32 prompts of random lengths in [32, 1024]
]
EXTEND_CASES = [  # name, requests, cached tokens, new tokens per request
    ("extend_32x(256+32)", 32, 256, 32),
    ("extend_8x(1024+128)", 8, 1024, 128),
    ("extend_8x(2048+512)", 8, 2048, 512),
]
DECODE_SWEEP = [  # keyword overrides of decode_attention
    dict(block_n=16, num_warps=4),
    dict(block_n=32, num_warps=4),
    dict(block_n=64, num_warps=4),
    dict(block_n=32, num_warps=2),
    dict(block_n=64, num_warps=8),
    dict(block_n=128, num_warps=8),
    dict(num_stages=2),
    dict(num_stages=4),
    dict(num_splits=1),
    dict(num_splits=2),
    dict(num_splits=4),
    dict(num_splits=8),
]
HEAD_DIM = 128
PREFILL_HEADS = 32
DEVICE = "cuda"


def time_ms(fn, warmup: int, iters: int) -> float:
    """Mean milliseconds per call, measured with CUDA events after warm-up."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def decode_inputs(batch: int, context: int, q_heads: int, kv_heads: int, gen: torch.Generator):
    pool = batch * context + 1024
    dev = DEVICE
    q = torch.randn(batch, q_heads, HEAD_DIM, generator=gen, device=dev).half()
    k_cache = torch.randn(pool, kv_heads, HEAD_DIM, generator=gen, device=dev).half()
    v_cache = torch.randn(pool, kv_heads, HEAD_DIM, generator=gen, device=dev).half()
    slot_table = torch.randperm(pool, generator=gen, device=dev)[: batch * context].view(batch, context)
    seq_lens = torch.full((batch,), context, device=dev)
    return q, k_cache, v_cache, slot_table, seq_lens


def bench_decode(ops, ref, case, args, gen, sweep: bool) -> tuple[dict, list[dict]]:
    name, batch, context, q_heads, kv_heads = case
    q, k_cache, v_cache, slot_table, seq_lens = decode_inputs(batch, context, q_heads, kv_heads, gen)
    scale = HEAD_DIM**-0.5
    kv_bytes = int(seq_lens.sum()) * kv_heads * HEAD_DIM * k_cache.element_size() * 2

    def measure(**overrides) -> dict:
        ms = time_ms(
            lambda: ops.decode_attention(q, k_cache, v_cache, slot_table, seq_lens, scale, **overrides),
            args.warmup,
            args.iters,
        )
        gbps = kv_bytes / (ms * 1e-3) / 1e9
        return dict(
            case=name,
            config=overrides or "default",
            ms=round(ms, 4),
            gbps=round(gbps, 1),
            fraction_of_peak=round(gbps / args.peak_gbps, 3),
        )

    head = slice(0, 2)  # the reference gathers in fp32: check two requests only
    out = ops.decode_attention(q[head], k_cache, v_cache, slot_table[head], seq_lens[head], scale)
    expected = ref.decode_attention(q[head], k_cache, v_cache, slot_table[head], seq_lens[head], scale)
    result = dict(
        measure(),
        batch=batch,
        context=context,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=HEAD_DIM,
        dtype="float16",
        kv_bytes=kv_bytes,
        max_abs_err=float((out.float() - expected.float()).abs().max()),
    )
    rows = [measure(**overrides) for overrides in DECODE_SWEEP] if sweep else []
    return result, rows


def bench_prefill(ops, case, args, gen) -> dict:
    name, lengths = case
    if lengths is None:
        lengths = torch.randint(32, 1025, (32,), generator=gen).tolist()
    heads, tokens = PREFILL_HEADS, sum(lengths)
    q, k, v = (torch.randn(tokens, heads, HEAD_DIM, generator=gen).to(DEVICE).half() for _ in range(3))
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(DEVICE)
    scale = HEAD_DIM**-0.5
    ms = time_ms(
        lambda: ops.prefill_attention(q, k, v, cu_seqlens, scale, max_seqlen=max(lengths)), args.warmup, args.iters
    )
    flops = sum(4 * n * (n + 1) / 2 * HEAD_DIM * heads for n in lengths)  # causal QK^T and PV
    first = slice(0, lengths[0])
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t[first].transpose(0, 1) for t in (q, k, v)), is_causal=True, scale=scale
    )
    out = ops.prefill_attention(q, k, v, cu_seqlens, scale)
    result = dict(
        case=name,
        requests=len(lengths),
        tokens=tokens,
        heads=heads,
        head_dim=HEAD_DIM,
        dtype="float16",
        ms=round(ms, 4),
        tokens_per_s=round(tokens / (ms * 1e-3)),
        tflops=round(flops / (ms * 1e-3) / 1e12, 1),
        max_abs_err=float((out[first].float() - expected.transpose(0, 1).float()).abs().max()),
    )
    if len(set(lengths)) == 1:  # a uniform batch: torch's fused attention as a yardstick
        batch = [t.view(len(lengths), lengths[0], heads, HEAD_DIM).transpose(1, 2) for t in (q, k, v)]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        sdpa_ms = time_ms(lambda: sdpa(*batch, is_causal=True, scale=scale), args.warmup, args.iters)
        result["torch_sdpa_tokens_per_s"] = round(tokens / (sdpa_ms * 1e-3))
    return result


def bench_extend(ops, ref, case, args, gen) -> dict:
    name, batch, cached, new = case
    heads, context, tokens = PREFILL_HEADS, cached + new, batch * new
    pool = batch * context + 1024
    k_cache, v_cache = (torch.randn(pool, heads, HEAD_DIM, generator=gen).to(DEVICE).half() for _ in range(2))
    q = torch.randn(tokens, heads, HEAD_DIM, generator=gen).to(DEVICE).half()
    slot_table = torch.randperm(pool, generator=gen)[: batch * context].view(batch, context).to(DEVICE)
    cu_seqlens = (torch.arange(batch + 1) * new).to(DEVICE)
    cached_lens = torch.full((batch,), cached, device=DEVICE)
    scale = HEAD_DIM**-0.5
    ms = time_ms(
        lambda: ops.extend_attention(q, k_cache, v_cache, cu_seqlens, slot_table, cached_lens, scale, max_seqlen=new),
        args.warmup,
        args.iters,
    )
    flops = batch * sum(4 * (cached + j + 1) * HEAD_DIM * heads for j in range(new))
    first = slice(0, new)
    out = ops.extend_attention(q[first], k_cache, v_cache, cu_seqlens[:2], slot_table[:1], cached_lens[:1], scale)
    expected = ref.extend_attention(q[first], k_cache, v_cache, cu_seqlens[:2], slot_table[:1], cached_lens[:1], scale)
    k, v = k_cache[slot_table[:, cached:].flatten()], v_cache[slot_table[:, cached:].flatten()]
    cold_ms = time_ms(
        lambda: ops.prefill_attention(q, k, v, cu_seqlens, scale, max_seqlen=new), args.warmup, args.iters
    )
    return dict(
        case=name,
        requests=batch,
        cached=cached,
        new=new,
        heads=heads,
        head_dim=HEAD_DIM,
        dtype="float16",
        ms=round(ms, 4),
        new_tokens_per_s=round(tokens / (ms * 1e-3)),
        tflops=round(flops / (ms * 1e-3) / 1e12, 1),
        cold_prefill_ms=round(cold_ms, 4),
        max_abs_err=float((out.float() - expected.float()).abs().max()),
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the JSON here as well")
    parser.add_argument("--peak-gbps", type=float, default=4800.0, help="the GPU's peak memory bandwidth (H200: ~4800)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--no-sweep", action="store_true", help="skip the decode configuration sweep")
    return parser.parse_args(argv)


def emit(report: dict, out: str | None) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        reason = "skipped: no CUDA device (this benchmark times compiled Triton kernels on a GPU)"
        print(reason, file=sys.stderr)
        emit({"skipped": reason}, args.out)
        return 0
    if os.environ.pop("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET unset: the benchmark times compiled kernels", file=sys.stderr)
    from slora_vtc_kernels import ops
    from slora_vtc_kernels import reference as ref

    triton_ops = ops("triton")
    gen = torch.Generator(device="cuda").manual_seed(0)
    cpu_gen = torch.Generator().manual_seed(0)
    report = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=__import__("triton").__version__,
        peak_gbps=args.peak_gbps,
        decode=[],
        decode_sweep=[],
        prefill=[],
        extend=[],
    )
    for case in DECODE_CASES:
        result, sweep = bench_decode(triton_ops, ref, case, args, gen, sweep=not args.no_sweep)
        report["decode"].append(result)
        report["decode_sweep"].extend(sweep)
        print(f"{case[0]}: {result['gbps']} GB/s ({result['fraction_of_peak']:.0%} of peak)", file=sys.stderr)
    for case in PREFILL_CASES:
        report["prefill"].append(bench_prefill(triton_ops, case, args, cpu_gen))
    for case in EXTEND_CASES:
        report["extend"].append(bench_extend(triton_ops, ref, case, args, cpu_gen))
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
