"""The plugin's cost inside vLLM's engine, without the HTTP path: the same burst through vLLM's offline
`LLM.generate`, with `scheduler_cls=slora_vtc.vllm.FairScheduler` (vtc) and as shipped.

benchmarks/vllm_plugin.py measures through vLLM's API server and its benchmark client, where on two
cores the bursts of one setup spread over nearly 2x (the server, the client and the engine share
the cores): too much to see a 3% difference. Here only the engine runs: issue 19's burst (64 random
prompts of 128 token ids, 128 tokens out each, `ignore_eos`, half from each of two tenants named in
`extra_args`, as the middleware names them) is handed to `LLM.generate` at once, and the output
tokens/s of each burst is timed. Each setup runs in its own process (one vLLM at a time on this
machine); blocks go stock, plugin, plugin, stock, ... (ABBA), so that a drift in the machine's speed
hits both alike; each block warms up with one burst (vLLM compiles new shapes), then measures
`--repeats`. Writes benchmarks/results/vllm_plugin_offline.json.

    .venv-vllm/bin/python benchmarks/vllm_plugin_offline.py [--blocks 4] [--repeats 3]

Target (issue 19): the plugin's throughput at least 0.97x vLLM's.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from machine import machine_info  # noqa: E402

from tests.vllm.server import CPU_ENV  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "vllm_plugin_offline.json"
TARGET = 0.97
PROMPTS, INPUT_LEN, OUTPUT_LEN = 64, 128, 128
PLUGIN = {"scheduler_cls": "slora_vtc.vllm.FairScheduler", "additional_config": {"slora_vtc": {"scheduler": "vtc"}}}


def burst_inputs(seed: int):
    from vllm import SamplingParams

    rng = random.Random(seed)
    prompts = [{"prompt_token_ids": rng.choices(range(3, 256), k=INPUT_LEN)} for _ in range(PROMPTS)]
    params = [
        SamplingParams(max_tokens=OUTPUT_LEN, ignore_eos=True, temperature=0, extra_args={"tenant": "ab"[k % 2]})
        for k in range(PROMPTS)
    ]
    return prompts, params


def timed_burst(llm, seed: int) -> float:
    prompts, params = burst_inputs(seed)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def run_block(setup: str, model: str, repeats: int, seed: int) -> list[float]:
    """In this process: one engine, a warm-up burst, `repeats` measured bursts (output tokens/s)."""
    from vllm import LLM

    extra = PLUGIN if setup == "plugin" else {}
    llm = LLM(model=model, dtype="float32", max_num_seqs=PROMPTS, seed=0, **extra)
    timed_burst(llm, seed)
    return [timed_burst(llm, seed + 1 + i) for i in range(repeats)]


def block(setup: str, model: Path, repeats: int, seed: int) -> list[float]:
    """One block in a child process (its engine gone with it)."""
    env = {**os.environ, **CPU_ENV, "PYTHONPATH": str(REPO)}
    result = Path(tempfile.mkdtemp()) / "rates.json"  # vLLM logs to stdout: the rates go to a file
    cmd = [sys.executable, __file__, "--block", setup, "--model", str(model), "--repeats", str(repeats)]
    cmd += ["--seed", str(seed), "--result", str(result)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"the {setup} block failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(result.read_text())


def summary(rates: list[float]) -> dict:
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": rates}


def measure(blocks: int, repeats: int) -> dict:
    from tests.vllm.model import build_tiny_llama

    model = build_tiny_llama(Path(tempfile.mkdtemp()) / "tiny")
    rates = {"stock": [], "plugin": []}
    order = [("stock", "plugin") if b % 2 == 0 else ("plugin", "stock") for b in range(blocks)]
    for b, pair in enumerate(order):
        for setup in pair:
            got = block(setup, model, repeats, seed=1000 * b)
            rates[setup] += got
            print(setup, [f"{r:.0f}" for r in got], flush=True)
    stock, plugin = summary(rates["stock"]), summary(rates["plugin"])
    return {
        "burst": {"prompts": PROMPTS, "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "tenants": 2},
        "blocks": blocks,
        "repeats": repeats,
        "order": [list(p) for p in order],
        "stock_tok_s": stock,
        "plugin_tok_s": plugin,
        "ratio": plugin["median"] / stock["median"],
        "target": TARGET,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=4, help="blocks of each setup, in ABBA order (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="measured bursts per block (default 3)")
    parser.add_argument("--block", choices=("stock", "plugin"), help=argparse.SUPPRESS)  # a child's one block
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.block:
        Path(opts.result).write_text(json.dumps(run_block(opts.block, opts.model, opts.repeats, opts.seed)))
        return
    import vllm

    result = {"machine": machine_info(vllm=vllm.__version__), **measure(opts.blocks, opts.repeats)}
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))


if __name__ == "__main__":
    main()
