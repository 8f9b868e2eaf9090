"""Throughput of the real backend: decode and prefill tokens/s, and the decode attention kernel's bandwidth.

    python scripts/bench_model.py --backend triton --model llama-7b --dtype float16 --out model_bench.json
    python scripts/bench_model.py --backend torch --model tiny --quick          # CPU smoke run

Decode: B requests with P-token prompts are prefilled, then `--steps` decode steps are timed
through the backend (host bookkeeping included): tokens/s = B * steps / time. Prefill: batches
of prompts totalling `--prefill-tokens`. Decode attention alone: the backend's op on layer 0 of
the pool, B requests of P + steps context each over random slots, timed over 20 calls; bytes moved
= K and V of every context token + the slot table + q and the output.
"""

import argparse
import json
import platform
import time

import torch

from slora_vtc.backends.llama import LlamaBackend, build_backend
from slora_vtc.memory import MemoryManager, TokenPool
from slora_vtc.request import Request


def decode_tokens_per_s(backend: LlamaBackend, memory: MemoryManager, batch: int, prompt: int, steps: int) -> float:
    reqs = [Request("bench", prompt, steps + 2, 0.0, rid=k) for k in range(batch)]
    memory.admit(reqs)
    result = backend.prefill(reqs)
    elapsed = 0.0
    for step in range(steps + 1):  # the first decode step is a warm-up for this batch shape
        for r, t in zip(reqs, result.tokens):
            r.append_token(t, 0.0)
        memory.extend(reqs)
        result = backend.decode(reqs)
        elapsed += result.elapsed if step else 0.0
    for r in reqs:
        memory.release(r)
        backend.release(r)
    return batch * steps / elapsed


def prefill_tokens_per_s(
    backend: LlamaBackend, memory: MemoryManager, prompt: int, total_tokens: int, repeats: int = 3
) -> float:
    batch = max(1, total_tokens // prompt)
    times = []
    for k in range(repeats + 1):  # the first is a warm-up
        reqs = [Request("bench", prompt, 2, 0.0, rid=1_000_000 + k * batch + i) for i in range(batch)]
        memory.admit(reqs)
        times.append(backend.prefill(reqs).elapsed)
        for r in reqs:
            memory.release(r)
            backend.release(r)
    return batch * prompt / min(times[1:])


def attention_bandwidth(backend: LlamaBackend, batch: int, context: int, iters: int = 20) -> dict:
    spec, pool, ops = backend.spec, backend.model.pool, backend.model.ops
    k_cache, v_cache = pool.k[0], pool.v[0]
    dev = backend.device
    gen = torch.Generator(device=dev).manual_seed(0)
    table = torch.randperm(pool.num_slots, generator=gen, device=dev)[: batch * context].view(batch, context)
    lens = torch.full((batch,), context, device=dev)
    q = torch.randn(batch, spec.num_heads, spec.head_dim, device=dev, dtype=k_cache.dtype, generator=gen)

    def call():
        return ops.decode_attention(q, k_cache, v_cache, table, lens, spec.head_dim**-0.5)

    call()
    backend._sync()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    backend._sync()
    seconds = (time.perf_counter() - start) / iters
    element = k_cache.element_size()
    moved = (
        2 * batch * context * spec.kv_width * element + table.numel() * table.element_size() + 2 * q.numel() * element
    )
    return {"batch": batch, "context": context, "us_per_call": seconds * 1e6, "gb_per_s": moved / seconds / 1e9}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="triton")
    p.add_argument("--model", default="llama-7b")
    p.add_argument("--device")
    p.add_argument("--dtype")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--prefill-tokens", type=int, default=8192)
    p.add_argument("--quick", action="store_true", help="small sizes (CPU smoke run)")
    p.add_argument("--out", help="write the numbers as JSON here")
    args = p.parse_args()
    if args.quick:
        args.batches, args.prompt, args.steps, args.prefill_tokens = "1,4", 32, 4, 128
    batches = [int(b) for b in args.batches.split(",")]
    pool = max(max(batches) * (args.prompt + args.steps + 2), args.prefill_tokens + args.prompt) + 16
    t0 = time.perf_counter()
    backend = build_backend(args.backend, args.model, pool_tokens=pool, device=args.device, dtype=args.dtype)
    backend.warmup()
    load_s = time.perf_counter() - t0
    memory = MemoryManager(TokenPool(pool), 0)
    report = {
        "backend": args.backend,
        "model": args.model,
        "dtype": str(backend.model.weights.embed.dtype),
        "device": str(backend.device),
        "gpu": torch.cuda.get_device_name(backend.device)
        if backend.device.type == "cuda"
        else platform.processor() or platform.machine(),
        "params": backend.spec.num_params,
        "load_and_warmup_s": load_s,
        "prompt": args.prompt,
        "decode_steps": args.steps,
        "decode_tokens_per_s": {b: decode_tokens_per_s(backend, memory, b, args.prompt, args.steps) for b in batches},
        "prefill_tokens_per_s": {
            n: prefill_tokens_per_s(backend, memory, n, args.prefill_tokens) for n in (128, args.prompt)
        },
        "decode_attention": [attention_bandwidth(backend, b, args.prompt + args.steps) for b in batches],
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
