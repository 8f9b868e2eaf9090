"""Decode throughput on the CPU: our engine + torch backend vs transformers' own `generate`.

    .venv/bin/python benchmarks/cpu_decode.py            # batch 16, context 512, 3 repeats;
                                                         # writes results/cpu_decode-last.json
    .venv/bin/python benchmarks/cpu_decode.py --record   # the same, recorded in results/cpu_decode.json (make bench)
    .venv/bin/python benchmarks/cpu_decode.py --quick    # shorter, 1 repeat, not written

Both run the same weights: a `tiny` Llama built with transformers (random, seed 0) and saved to a
temporary folder, which our loader reads. Each side serves the same batch of 16 prompts of 256
random tokens and generates 256 tokens (context 512 at the end, EOS ignored, greedy). Decode time
is the time of that run minus the time of the same run with 1 new token (prefill only), so each
side's own per-step overhead (our engine loop and scheduler; transformers' generation loop) is
counted. Reported: decode tokens/s = 16 * 255 / decode time, median of the repeats, and the ratio
ours / transformers. Both use the same number of torch threads (--threads, default 1: on this shared
2-vCPU machine two OpenMP threads make either side's steps up to 10x slower, erratically).
Our engine admits the whole batch in one prefill (its prefill token budget is set to the batch's prompt
tokens; the run checks it). Writes benchmarks/results/cpu_decode-last.json, which git ignores; the
tracked cpu_decode.json (quoted by benchmarks/README.md) changes only with --record.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from slora_vtc.backends.llama import build_backend  # noqa: E402
from slora_vtc.builder import build_engine  # noqa: E402
from slora_vtc.clock import VirtualClock  # noqa: E402
from slora_vtc.config import EngineConfig  # noqa: E402
from slora_vtc.model.spec import get_model_spec  # noqa: E402
from slora_vtc.request import Request  # noqa: E402
from slora_vtc.sched import build_scheduler  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RECORDED = RESULTS / "cpu_decode.json"  # what the docs quote
LAST = RESULTS / "cpu_decode-last.json"  # ignored by git


def hf_tiny(folder: Path) -> LlamaForCausalLM:
    s = get_model_spec("tiny")
    config = LlamaConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        max_position_embeddings=s.max_position,
        rms_norm_eps=s.rms_norm_eps,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def ours(folder: Path, prompts: torch.Tensor, new_tokens: int) -> float:
    """Wall seconds of one engine run serving every prompt (all admitted together, in one prefill)."""
    batch, prompt_len = prompts.shape
    pool = batch * (prompt_len + new_tokens) + 1
    backend = build_backend("torch", str(folder), pool_tokens=pool)
    prefill_sizes = count_prefills(backend)
    config = EngineConfig(pool_tokens=pool, lora_rank=0, batch_max_tokens_override=batch * prompt_len)
    engine = build_engine(config, build_scheduler("fcfs", ["c"]), backend, VirtualClock())  # warmed up
    requests = [Request("c", prompt_len, new_tokens, 0.0, prompt_ids=p.tolist()) for p in prompts]
    start = time.perf_counter()
    engine.run(requests)
    elapsed = time.perf_counter() - start
    assert all(r.generated == new_tokens for r in requests)
    assert prefill_sizes == [batch], f"the engine split the batch of {batch} into prefills of {prefill_sizes}"
    return elapsed


def count_prefills(backend) -> list[int]:
    """The size of every prefill the backend runs from now on (the list fills as the engine runs)."""
    sizes, prefill = [], backend.prefill

    def counted(reqs):
        sizes.append(len(reqs))
        return prefill(reqs)

    backend.prefill = counted
    return sizes


def transformers_generate(model: LlamaForCausalLM, prompts: torch.Tensor, new_tokens: int) -> float:
    with torch.inference_mode():
        model.generate(
            prompts[:, :8],
            attention_mask=torch.ones_like(prompts[:, :8]),
            max_new_tokens=2,
            do_sample=False,
            pad_token_id=0,
        )  # warm-up
        start = time.perf_counter()
        out = model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        elapsed = time.perf_counter() - start
    assert out.shape[1] == prompts.shape[1] + new_tokens
    return elapsed


def decode_tokens_per_s(run, batch: int, new_tokens: int) -> float:
    return batch * (new_tokens - 1) / (run(new_tokens) - run(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 new tokens, 1 repeat; nothing recorded")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=512, help="prompt + new tokens (half each)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, for both sides")
    parser.add_argument(
        "--record", action="store_true", help=f"write {RECORDED.name}, which the docs quote (make bench does)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch, prompt_len = args.batch, args.context // 2
    new_tokens = 64 if args.quick else args.context - prompt_len
    repeats = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = hf_tiny(folder)
        prompts = torch.randint(
            3, model.config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(1)
        )
        samples = {"ours": [], "transformers": []}
        for _ in range(repeats):
            samples["ours"].append(decode_tokens_per_s(lambda n: ours(folder, prompts, n), batch, new_tokens))
            samples["transformers"].append(
                decode_tokens_per_s(lambda n: transformers_generate(model, prompts, n), batch, new_tokens)
            )
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratio = medians["ours"] / medians["transformers"]
    print(f"decode tokens/s, batch {batch}, context {prompt_len} + {new_tokens}, {torch.get_num_threads()} threads:")
    for k, v in samples.items():
        print(f"  {k:12s} {medians[k]:9.0f}   (samples: {', '.join(f'{x:.0f}' for x in v)})")
    print(f"  ratio ours / transformers: {ratio:.2f} (target >= 1)")
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        record = {
            "benchmark": "cpu_decode",
            "model": "tiny (transformers LlamaForCausalLM, random, seed 0)",
            "batch": batch,
            "prompt_len": prompt_len,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "decode_tokens_per_s": medians,
            "samples": samples,
            "ratio": ratio,
            "target_ratio": 1.0,
            "machine": {
                "cpus": os.cpu_count(),
                "threads": torch.get_num_threads(),
                "processor": platform.processor() or platform.machine(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
            },
            "measured_at": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        out = RECORDED if args.record else LAST
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
