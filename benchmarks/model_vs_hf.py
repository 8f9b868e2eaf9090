"""Our Llama (`--backend torch`) against transformers' LlamaForCausalLM on the CPU: prefill and decode tokens/s.

    .venv/bin/python benchmarks/run.py --only model     # the full grid, ~2.5 minutes; recorded in results/cpu.json
    .venv/bin/python benchmarks/model_vs_hf.py          # the same, printed only (--quick: a small grid, ~5 s)

Both sides run the same random weights: a Llama built with transformers (MODEL, seed 0), saved to a
temporary folder and read back by our loader. For every (batch, context) cell each side prefills
`batch` random prompts of `context` tokens (timed: prefill tokens/s), then decodes STEPS tokens greedily
(each step timed; the first is a warm-up): decode tokens/s = batch / median step time. Ours goes through
the backend (LlamaBackend.prefill / decode: host bookkeeping, slot table and sampling included);
transformers runs its forward with a DynamicCache and `logits_to_keep=1`, taking the argmax itself.
Both use the same number of torch threads (`threads`, default 1, as our backend picks for a model this size).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from slora_vtc.backends.llama import LlamaBackend, build_backend  # noqa: E402
from slora_vtc.memory import MemoryManager, TokenPool  # noqa: E402
from slora_vtc.request import Request  # noqa: E402

# Big enough that attention and the matmuls, not Python, take a step's time; small enough for 2 cores.
MODEL = dict(
    vocab_size=4096,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)
BATCHES = (1, 16, 64)
CONTEXTS = (128, 512, 1024)
STEPS = 8  # timed decode steps per cell, after one warm-up step
FIRST_TOKEN = 3  # random prompts avoid the special tokens
TARGET_DECODE_RATIO = 1.0  # ours / transformers, decode at batch 64 and context 512 (benchmarks/run.py checks it)


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...] = BATCHES
    contexts: tuple[int, ...] = CONTEXTS
    steps: int = STEPS
    threads: int = 1


QUICK = Grid(batches=(1, 4), contexts=(32, 64), steps=3)


def describe_model() -> str:
    m = MODEL
    return (
        f"hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, {m['num_attention_heads']} query / "
        f"{m['num_key_value_heads']} KV heads, MLP {m['intermediate_size']}, vocabulary {m['vocab_size']}"
    )


def build_hf(folder: Path) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**MODEL)).eval()
    model.save_pretrained(folder)
    return model


def random_prompts(batch: int, context: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(batch * 10_000 + context)
    return torch.randint(FIRST_TOKEN, MODEL["vocab_size"], (batch, context), generator=gen)


# -- ours -----------------------------------------------------------------------------------
def ours_cell(
    backend: LlamaBackend, memory: MemoryManager, prompts: torch.Tensor, steps: int
) -> tuple[float, list[float]]:
    """(prefill seconds, seconds of each decode step after the warm-up one)."""
    reqs = [
        Request("bench", prompts.shape[1], steps + 2, 0.0, rid=k, prompt_ids=p.tolist()) for k, p in enumerate(prompts)
    ]
    memory.admit(reqs)
    result = backend.prefill(reqs)
    prefill_s, step_s = result.elapsed, []
    for _ in range(steps + 1):
        for r, t in zip(reqs, result.tokens):
            r.append_token(t, 0.0)
        memory.extend(reqs)
        result = backend.decode(reqs)
        step_s.append(result.elapsed)
    for r in reqs:
        memory.release(r)
        backend.release(r)
    return prefill_s, step_s[1:]


# -- transformers ---------------------------------------------------------------------------
@torch.inference_mode()
def hf_cell(model: LlamaForCausalLM, prompts: torch.Tensor, steps: int) -> tuple[float, list[float]]:
    cache = DynamicCache()
    start = time.perf_counter()
    logits = model(input_ids=prompts, cache=cache, use_cache=True, logits_to_keep=1).logits
    token = logits[:, -1].argmax(-1, keepdim=True)
    token.tolist()  # what our backend does with its tokens (a host copy), so both stop the clock at the same point
    prefill_s, step_s = time.perf_counter() - start, []
    for _ in range(steps + 1):
        start = time.perf_counter()
        logits = model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
        token.tolist()
        step_s.append(time.perf_counter() - start)
    return prefill_s, step_s[1:]


# -- the grid -------------------------------------------------------------------------------
def row(batch: int, context: int, ours: tuple[float, list[float]], hf: tuple[float, list[float]]) -> dict:
    tokens = batch * context
    result = {"batch": batch, "context": context}
    for side, (prefill_s, step_s) in (("ours", ours), ("transformers", hf)):
        step = statistics.median(step_s)
        result[side] = {
            "prefill_tokens_per_s": tokens / prefill_s,
            "prefill_ms": prefill_s * 1e3,
            "decode_tokens_per_s": batch / step,
            "decode_step_ms": step * 1e3,
            "decode_step_samples_ms": [s * 1e3 for s in step_s],
        }
    result["prefill_ratio"] = result["ours"]["prefill_tokens_per_s"] / result["transformers"]["prefill_tokens_per_s"]
    result["decode_ratio"] = result["ours"]["decode_tokens_per_s"] / result["transformers"]["decode_tokens_per_s"]
    return result


def measure(grid: Grid = Grid()) -> dict:
    """Every cell of the grid, ours and transformers, with the model and thread count."""
    pool = max(grid.batches) * (max(grid.contexts) + grid.steps + 3) + 16
    with tempfile.TemporaryDirectory() as tmp:
        hf = build_hf(Path(tmp))
        backend = build_backend("torch", tmp, pool_tokens=pool)
        torch.set_num_threads(grid.threads)  # after build_backend, which picks its own count; both sides get this one
        backend.warmup()
        memory = MemoryManager(TokenPool(pool), 0)
        cells = [(b, c) for c in grid.contexts for b in grid.batches]
        hf_cell(hf, random_prompts(1, 16), 1)  # transformers' first call is slow
        rows = []
        for batch, context in tqdm(cells, desc="model vs transformers", leave=False):
            prompts = random_prompts(batch, context)
            rows.append(
                row(batch, context, ours_cell(backend, memory, prompts, grid.steps), hf_cell(hf, prompts, grid.steps))
            )
    import transformers

    return {
        "model": describe_model(),
        "config": MODEL,
        "threads": torch.get_num_threads(),
        "decode_steps": grid.steps,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "rows": rows,
    }


def markdown_table(result: dict) -> str:
    """The table benchmarks/README.md includes."""
    lines = [
        f"Model: {result['model']} (random, float32); {result['threads']} torch thread(s); "
        f"transformers {result['transformers']}, torch {result['torch']}.",
        "",
        "| batch | context | prefill tok/s ours | transformers | ratio | decode tok/s ours | transformers | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        o, t = r["ours"], r["transformers"]
        lines.append(
            f"| {r['batch']} | {r['context']:,} | {o['prefill_tokens_per_s']:,.0f} | "
            f"{t['prefill_tokens_per_s']:,.0f} | {r['prefill_ratio']:.2f} | {o['decode_tokens_per_s']:,.0f} | "
            f"{t['decode_tokens_per_s']:,.0f} | {r['decode_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small grid (smoke run)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    grid = QUICK if args.quick else Grid()
    print(markdown_table(measure(Grid(grid.batches, grid.contexts, grid.steps, args.threads))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
