"""Where our engine's time goes on serve_vs_vllm.py's burst, without HTTP: the engine alone, in this process.

The burst: 64 prompts of 128 random tokens, 128 new tokens each, all queued at once, FCFS, the torch backend on
one thread, float32, on a model folder (the one serve_vs_vllm.py serves). Measured in CPU seconds of this thread
(time.thread_time), not wall time: on a shared machine the wall clock mostly measures the neighbours. Two ways
of decoding alternate, `--repeats` times each after an untimed run: `dense` (the default: the batch's K/V kept
densely across steps, model/batch_kv.py) and `gather` (each step gathers the batch's context out of the pool, as
before). One cProfile run of each gives the shares of the largest ops. Both must produce the same tokens.
Writes benchmarks/results/engine_burst.json.

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402

from slora_vtc.backends.registry import BackendSettings, build_backend  # noqa: E402
from slora_vtc.builder import build_engine  # noqa: E402
from slora_vtc.config import EngineConfig  # noqa: E402
from slora_vtc.request import Request  # noqa: E402
from slora_vtc.sched.registry import build_scheduler  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "engine_burst.json"
OPS = {  # cProfile names of the ops whose shares are reported
    "kv_gather": "{method 'index_select' of 'torch._C.TensorBase' objects}",
    "linear": "{built-in method torch._C._nn.linear}",
    "attention": "{built-in method torch._C._nn.scaled_dot_product_attention}",
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
    dense_kv = backend.batch_kv
    modes = {"dense": dense_kv, "gather": None}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    outputs = {}
    for i in range(args.repeats + 1):
        for mode in modes if i % 2 == 0 else list(modes)[::-1]:
            backend.batch_kv = modes[mode]
            seconds, tokens, outputs[mode] = burst(backend, args)
            if i:  # the first round is untimed
                cpu[mode].append(seconds)
    if outputs["dense"] != outputs["gather"]:
        raise SystemExit("the dense and the gathering decode produced different tokens")
    profiles = {}
    for mode, kv in modes.items():
        backend.batch_kv = kv
        prof = cProfile.Profile()
        burst(backend, args, prof)
        profiles[mode] = shares(prof)
    median = {m: statistics.median(v) for m, v in cpu.items()}
    record = {
        "machine": machine_info(torch=torch.__version__),
        "burst": {"prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len},
        "tokens": tokens,
        "cpu_s": {m: {"median": median[m], "all": v} for m, v in cpu.items()},
        "cpu_tokens_per_s": {m: tokens / s for m, s in median.items()},
        "speedup": median["gather"] / median["dense"],
        "op_shares": profiles,
        "same_tokens": True,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("cpu_s", "speedup", "op_shares")}, indent=1))


if __name__ == "__main__":
    main()
