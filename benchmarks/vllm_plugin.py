"""The plugin's cost inside vLLM: output throughput on the same burst with `--scheduler-cls
slora_vtc.vllm.FairScheduler` (vtc) and with vLLM as shipped, and the plugin's time per step.

The burst is issue 19's: 64 random prompts of 128 tokens, 128 tokens out each (`ignore_eos`), all at
once, against the tiny random Llama of tests/vllm (4 layers, hidden 256), with vLLM's own benchmark
client (`vllm bench serve`, imported). Two tenants (X-Client-Id "a" and "b", half the burst each) so
that the plugin has tenants to order. Each server is started once per block (this machine holds one
vLLM at a time); a block warms up with one burst, then measures `--repeats` bursts; `--blocks`
blocks alternate stock and plugin. Medians and the spread (min, max) per setup; the plugin's own
time per step (ordering the running list, charging: `plugin_ms_per_step`) and its whole schedule()
per step come from its stats file. Writes benchmarks/results/vllm_plugin.json.

    .venv-vllm/bin/python benchmarks/vllm_plugin.py [--blocks 1] [--repeats 3] [--plugin-first] [--append]

Target (issue 19): the plugin's throughput at least 0.97x vLLM's. Bursts vary by more than that on a
shared machine, so the results also give the plugin's own time as a share of a step (`plugin_share`),
the most it can take from throughput.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from machine import machine_info  # noqa: E402

from tests.vllm.model import build_tiny_llama  # noqa: E402
from tests.vllm.server import VllmServer, plugin_args  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "vllm_plugin.json"
TARGET = 0.97
PROMPTS, INPUT_LEN, OUTPUT_LEN = 64, 128, 128


def burst(url: str, model: Path, tenant: str, seed: int) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", url, "--model", "tiny", "--tokenizer", str(model),
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(PROMPTS // 2), "--ignore-eos", "--seed", str(seed), "--disable-tqdm",
        "--header", f"X-Client-Id={tenant}",
    ])  # fmt: skip
    return main(args)


def both_tenants(url: str, model: Path, seed: int) -> float:
    """One burst: both tenants' halves at once (two clients in threads); output tokens/s of the whole."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda t: burst(url, model, t, seed + (t == "b")), ["a", "b"]))
    tokens = sum(r["total_output_tokens"] for r in results)
    return tokens / max(r["duration"] for r in results)


def block(setup: str, model: Path, repeats: int, seed: int) -> tuple[list[float], dict | None]:
    stats_file = Path(tempfile.mkdtemp()) / "stats.json"
    args = ["--max-num-seqs", str(PROMPTS)]
    if setup == "plugin":
        args += plugin_args({"scheduler": "vtc", "stats_file": str(stats_file), "log_interval_s": 30.0})
    with VllmServer(model, args, env={"PYTHONPATH": str(REPO)}) as server:
        both_tenants(server.url, model, seed)  # warm-up: new shapes compile
        rates = [both_tenants(server.url, model, seed + 10 * (i + 1)) for i in range(repeats)]
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else None
    return rates, stats


def plugin_share(result: dict) -> dict:
    """The plugin's own time as a share of a step, the cost it can have on throughput: a step lasts about
    a burst's output tokens / the plugin's median output tokens/s / the steps of a burst (every block
    ran `repeats` bursts and one warm-up, all alike)."""
    bursts = result["blocks"] * (result["repeats"] + 1)
    step_ms = 1000 * PROMPTS * OUTPUT_LEN / result["plugin_tok_s"]["median"] / (result["steps"] / bursts)
    return {"step_ms": step_ms, "plugin_share_of_step": result["plugin_ms_per_step"] / step_ms}


def summary(rates: list[float]) -> dict:
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plugin-first", action="store_true", help="begin with the plugin's block")
    parser.add_argument("--append", action="store_true", help="add to the runs of the results file")
    opts = parser.parse_args()
    model = build_tiny_llama(Path(tempfile.mkdtemp()) / "tiny")
    rates = {"stock": [], "plugin": []}
    plugin_stats = []
    blocks = opts.blocks
    if opts.append:
        before = json.loads(RESULTS.read_text())
        rates = {"stock": before["stock_tok_s"]["runs"], "plugin": before["plugin_tok_s"]["runs"]}
        keys = ("steps", "plugin_ms_per_step", "schedule_ms_per_step")
        plugin_stats = before.get("plugin_blocks", [{k: before[k] for k in keys}])
        blocks += before["blocks"]
    for b in range(opts.blocks):
        for setup in ("stock", "plugin") if (b % 2 == 0) != opts.plugin_first else ("plugin", "stock"):
            got, stats = block(setup, model, opts.repeats, seed=100 * b)
            rates[setup] += got
            if stats:
                plugin_stats.append(stats)
            print(setup, [f"{r:.0f}" for r in got], flush=True)
    stock, plugin = summary(rates["stock"]), summary(rates["plugin"])
    import vllm

    result = {
        "machine": machine_info(vllm=vllm.__version__),
        "burst": {"prompts": PROMPTS, "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "tenants": 2},
        "blocks": blocks,
        "repeats": opts.repeats,
        "stock_tok_s": stock,
        "plugin_tok_s": plugin,
        "ratio": plugin["median"] / stock["median"],
        "target": TARGET,
        "plugin_ms_per_step": statistics.median(s["plugin_ms_per_step"] for s in plugin_stats),
        "schedule_ms_per_step": statistics.median(s["schedule_ms_per_step"] for s in plugin_stats),
        "steps": sum(s["steps"] for s in plugin_stats),
        "plugin_blocks": [
            {k: s[k] for k in ("steps", "plugin_ms_per_step", "schedule_ms_per_step")} for s in plugin_stats
        ],
    }
    result |= plugin_share(result)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))


if __name__ == "__main__":
    main()
