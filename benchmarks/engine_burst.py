"""Where our engine's time goes on serve_vs_vllm.py's burst, without HTTP: the engine alone, in this process.

The burst: 64 prompts of 128 random tokens, 128 new tokens each, all queued at once, FCFS, the torch backend on
one thread, float32, on a model folder (the one serve_vs_vllm.py serves). Measured in CPU seconds of this thread
(time.thread_time), not wall time: on a shared machine the wall clock mostly measures the neighbours. Four ways
of running it alternate, `--repeats` times each after an untimed run: `dense` (the defaults: the projections on
oneDNN-packed weights, model/linear.py, and the batch's K/V kept densely across decode steps and attended by two
matmuls, model/batch_kv.py), `sdpa` (the dense copy attended by SDPA's fused kernel, as before the matmuls),
`gather` (each decode step gathers the batch's context out of the pool, as before batch_kv.py) and `unpacked`
(the projections on the weights as loaded, through F.linear, as before linear.py). One cProfile run of each gives
the shares of the largest ops. All four must produce the same tokens. Beside the burst, the projections' own
speed: GFLOP/s of F.linear and of the packed path on the model's weight shapes, for a decode batch's rows and a
prefill's; and the decode attention's own time on the burst's shape (every layer's K/V, too large for the cache)
in three ways, against the time it takes to read those K/V once (`attention_layouts`). Writes
benchmarks/results/engine_burst.json.

    .venv/bin/python benchmarks/engine_burst.py --model DIR
"""

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402

from slora_vtc.backends.registry import BackendSettings, build_backend  # noqa: E402
from slora_vtc.builder import build_engine  # noqa: E402
from slora_vtc.config import EngineConfig  # noqa: E402
from slora_vtc.model.batch_kv import BatchKV  # noqa: E402
from slora_vtc.model.linear import linear, pack  # noqa: E402
from slora_vtc.model.weights import load_weights  # noqa: E402
from slora_vtc.request import Request  # noqa: E402
from slora_vtc.sched.registry import build_scheduler  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "engine_burst.json"
OPS = {  # cProfile names of the ops whose shares are reported
    "kv_gather": "{method 'index_select' of 'torch._C.TensorBase' objects}",
    "linear": "{built-in method torch._C._nn.linear}",
    "packed_linear": "{built-in method torch._ops.mkldnn._linear_pointwise}",
    "attention": "{built-in method torch._C._nn.scaled_dot_product_attention}",
    "attention_matmuls": "{built-in method torch.matmul}",
    "rms_norm": "{built-in method torch.rms_norm}",
}


def burst(backend, args, profile: cProfile.Profile | None = None) -> tuple[float, int, list[list[int]]]:
    """CPU seconds of one burst, the tokens generated, and each request's output ids."""
    engine = build_engine(
        EngineConfig(pool_tokens=args.pool_tokens, lora_rank=0), build_scheduler("fcfs", ["c"]), backend
    )
    gen = torch.Generator().manual_seed(args.seed)
    vocab = backend.spec.vocab_size
    reqs = [
        Request(
            "c",
            args.input_len,
            args.output_len,
            0.0,
            prompt_ids=torch.randint(3, vocab, (args.input_len,), generator=gen).tolist(),
        )
        for _ in range(args.num_prompts)
    ]
    for req in reqs:
        engine.add_request(req)
    start = time.thread_time()
    if profile:
        profile.enable()
    while engine.busy:
        engine.step()
    if profile:
        profile.disable()
    return time.thread_time() - start, sum(r.generated for r in reqs), [r.output_ids for r in reqs]


def shares(profile: cProfile.Profile) -> dict:
    stats = pstats.Stats(profile).stats
    total = sum(s[2] for s in stats.values())  # tottime over every function
    own = {pstats.func_std_string(k): s[2] for k, s in stats.items()}
    out = {name: own.get(key, 0.0) / total for name, key in OPS.items()}
    out["other"] = 1 - sum(out.values())
    return out


def projection_speeds(weights, decode_rows: int, prefill_rows: int, repeats: int = 20) -> dict:
    """GFLOP/s of one layer's four projections together, through F.linear and packed, per row count."""
    layer = weights.layers[0]
    shapes = [layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down]
    flops_per_row = sum(2 * w.shape[0] * w.shape[1] for w in shapes)
    out = {}
    for name, rows in (("decode", decode_rows), ("prefill", min(prefill_rows, 2048))):
        xs = [torch.randn(rows, w.shape[1]) for w in shapes]
        ways = {"f_linear": shapes, "packed": [pack(w) for w in shapes]}
        speeds = {}
        for way, ws in ways.items():
            with torch.inference_mode():
                for x, w in zip(xs, ws):  # warm up oneDNN's primitive cache
                    linear(x, w)
                start = time.perf_counter()
                for _ in range(repeats):
                    for x, w in zip(xs, ws):
                        linear(x, w)
                seconds = (time.perf_counter() - start) / repeats
            speeds[way] = flops_per_row * rows / seconds / 1e9
        out[name] = {"rows": rows, **speeds, "packed_over_f_linear": speeds["packed"] / speeds["f_linear"]}
    return out


def attention_layouts(spec, batch: int, context: int, capacity: int, repeats: int = 20) -> dict:
    """Milliseconds of one decode step's float32 attention over every layer (one query row per request, the K/V
    of `batch` requests at `context` tokens in a copy of `capacity` columns, as batch_kv.py keeps it): scores as
    K q^T (K laid out as V, batch_kv.py's way), as q K^T over K transposed (its way before), SDPA; and a sum
    over the same K/V, the time reading them takes. Each layer's K/V are read in turn, as a step reads them."""
    layers, heads, dim = spec.num_layers, spec.num_kv_heads, spec.head_dim
    group = spec.num_heads // heads
    q = torch.randn(batch, heads, group, dim)
    k = torch.randn(layers, batch, heads, capacity, dim)
    k_t = k.transpose(-1, -2).contiguous()
    v = torch.randn(layers, batch, heads, capacity, dim)
    flat = torch.cat([k[:, :, :, :context].flatten(), v[:, :, :, :context].flatten()]).view(2, layers, -1)
    ways = {
        "k_qt": lambda i: torch.matmul(
            torch.matmul(k[i, :, :, :context], q.transpose(-1, -2)).transpose(-1, -2).softmax(-1), v[i, :, :, :context]
        ),
        "q_kt": lambda i: torch.matmul(torch.matmul(q, k_t[i, ..., :context]).softmax(-1), v[i, :, :, :context]),
        "sdpa": lambda i: F.scaled_dot_product_attention(q, k[i, :, :, :context], v[i, :, :, :context]),
        "read": lambda i: flat[0, i].sum() + flat[1, i].sum(),
    }
    out = {}
    with torch.inference_mode():
        for name, way in ways.items():
            way(0)
            start = time.perf_counter()
            for _ in range(repeats):
                for i in range(layers):
                    way(i)
            out[name] = (time.perf_counter() - start) / repeats * 1e3
    return {"batch": batch, "context": context, "capacity": capacity, "megabytes": flat.numel() * 4 / 1e6, "ms": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model folder")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--pool-tokens", type=int, default=32_768)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    backend = build_backend("torch", BackendSettings(pool_tokens=args.pool_tokens, model=args.model, dtype="float32"))
    backend.warmup()
    model = backend.model
    packed, as_loaded = model.weights, load_weights(args.model, backend.spec, "cpu", torch.float32)
    modes = {  # mode -> (the dense K/V copy or None, the weights)
        "dense": (backend.batch_kv, packed),
        "sdpa": (BatchKV(model.pool.k, matmuls=False), packed),
        "gather": (None, packed),
        "unpacked": (backend.batch_kv, as_loaded),
    }
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    outputs = {}
    for i in range(args.repeats + 1):
        for mode in modes if i % 2 == 0 else list(modes)[::-1]:
            backend.batch_kv, model.weights = modes[mode]
            seconds, tokens, outputs[mode] = burst(backend, args)
            if i:  # the first round is untimed
                cpu[mode].append(seconds)
    if len({str(o) for o in outputs.values()}) != 1:
        raise SystemExit(f"the modes produced different tokens: {', '.join(modes)}")
    profiles = {}
    for mode, (kv, weights) in modes.items():
        backend.batch_kv, model.weights = kv, weights
        prof = cProfile.Profile()
        burst(backend, args)
        burst(backend, args, prof)
        profiles[mode] = shares(prof)
    median = {m: statistics.median(v) for m, v in cpu.items()}
    record = {
        "machine": machine_info(torch=torch.__version__),
        "burst": {"prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len},
        "repeats": args.repeats,
        "tokens": tokens,
        "cpu_s": {m: {"median": median[m], "all": v} for m, v in cpu.items()},
        "cpu_tokens_per_s": {m: tokens / s for m, s in median.items()},
        "speedup": median["gather"] / median["dense"],
        "matmuls_speedup": median["sdpa"] / median["dense"],
        "packing_speedup": median["unpacked"] / median["dense"],
        "projection_gflops": projection_speeds(as_loaded, args.num_prompts, args.input_len * args.num_prompts),
        "attention_layouts": attention_layouts(
            backend.spec, args.num_prompts, args.input_len + args.output_len // 2, args.input_len + args.output_len
        ),
        "op_shares": profiles,
        "same_tokens": True,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    shown = ("cpu_s", "speedup", "matmuls_speedup", "packing_speedup", "projection_gflops", "attention_layouts")
    print(json.dumps({k: record[k] for k in shown}, indent=1))


if __name__ == "__main__":
    main()
