"""Our `serve` against vLLM on the same burst, the same model folder and the same client (issue 19, item 7).

The burst: `--num-prompts` random prompts of `--input-len` tokens, `--output-len` tokens out each
(`ignore_eos`), all sent at once (request rate inf). The client is vLLM's own `vllm bench serve`
(`vllm.benchmarks.serve`, run by vLLM's python: its console script does not work in that venv),
streaming `/v1/completions` against each server.

Both servers run on the same model folder, in float32 (the folder's dtype; vLLM picks bfloat16 on
this CPU unless told, so it is given `--dtype float32`), with a batch that holds the whole burst:
vLLM's defaults on a CPU (`--max-num-seqs` 128, chunked prefill of 2,048 tokens, a KV cache of
`VLLM_CPU_KVCACHE_SPACE` GiB, far more than the burst needs) and ours with a pool of `--pool-tokens`
(64 x 256 tokens fit with room to spare; conservative admission reserves each request's worst case).
vLLM runs with `--enforce-eager` only when asked (`--vllm-eager`): by default it compiles, as a user
gets it. Both are started once (vLLM takes minutes to start), warmed up with one burst each
(vLLM compiles new shapes on its first steps), then bursts alternate ours / vLLM `--repeats` times
so that drift on a shared machine hits both alike. Per repeat the ratio ours / vLLM of output
tokens/s; medians, min and max. Writes benchmarks/results/serve_vs_vllm.json.

The prompts: `vllm bench serve`'s random dataset makes each prompt a run of consecutive token ids from
a random offset, so with a vocabulary of a few hundred ids some prompts of a burst are the same, and a
burst repeated with the same seed finds most of its prompts in vLLM's prefix cache, which is on by
default. So each repeat draws prompts of its own (seed + 1 + repeat; every server gets the same ones),
and ours runs with `--prefix-cache` too.

    .venv/bin/python benchmarks/serve_vs_vllm.py --model DIR [--vllm-python .venv-vllm/bin/python]

Targets: ours at least 0.9x vLLM's output tokens/s, then 1.0x.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent  # this checkout: the package every row but `before` runs
RESULTS = ROOT / "benchmarks" / "results" / "serve_vs_vllm.json"
TARGET, GOAL = 0.9, 1.0
KEPT = ("output_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "mean_itl_ms")
KEPT += ("duration", "completed", "total_output_tokens", "server_cpu_s")
# vLLM's step settings on a CPU (its defaults there: 128 requests, 2,048 tokens a step, blocks of 128)
CHUNKED = ["--batching", "chunked", "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--block-size", "128"]
CLIENT = (
    "import argparse, sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = argparse.ArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    """Start a server in the work folder: `python -m` puts its working directory first on sys.path, so started
    from a checkout it would import that checkout's package whatever PYTHONPATH says (`--baseline`)."""
    with log.open("w") as out:
        # a process group of its own, in this session (tests/vllm/server.py says why)
        return subprocess.Popen(
            cmd, env={**os.environ, **env}, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, process_group=0
        )


def package_source(python: str, env: dict, cwd: Path) -> str:
    """The folder a server started so imports slora_vtc from (the record says which code each row ran)."""
    code = "import pathlib, slora_vtc; print(pathlib.Path(slora_vtc.__file__).parent.parent)"
    done = subprocess.run([python, "-c", code], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True)
    return done.stdout.strip() or f"unknown ({done.stderr.strip().splitlines()[-1:]})"


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout_s: float) -> float:
    start_t = time.monotonic()
    while time.monotonic() - start_t < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"server on port {port} exited ({proc.returncode}); see {log}")
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return time.monotonic() - start_t
        except httpx2.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"server on port {port} not ready in {timeout_s:.0f} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_seconds(proc: subprocess.Popen) -> float:
    """CPU time (user + system) of the server and its child processes so far (vLLM runs three)."""
    root = psutil.Process(proc.pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def burst(args, proc: subprocess.Popen, port: int, model_name: str, out_dir: Path, tag: str, seed: int) -> dict:
    """One `vllm bench serve` burst of the prompts `seed` draws against the server on `port`: its result file's
    numbers, and the CPU seconds the server spent on it."""
    name = f"{tag}.json"
    cmd = [
        args.vllm_python, "-c", CLIENT,
        "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
        "--model", model_name, "--tokenizer", str(args.model),
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
        "--request-rate", "inf", "--ignore-eos", "--seed", str(seed), "--disable-tqdm",
        "--save-result", "--result-dir", str(out_dir), "--result-filename", name,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    cpu_before = cpu_seconds(proc)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.burst_timeout)
    server_cpu = cpu_seconds(proc) - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed against port {port}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads((out_dir / name).read_text())
    if result["completed"] != args.num_prompts:
        raise SystemExit(f"{tag}: only {result['completed']} of {args.num_prompts} requests completed")
    return {**{k: result[k] for k in KEPT[:-1]}, "server_cpu_s": server_cpu}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="a Hugging Face model folder with a tokenizer")
    p.add_argument(
        "--vllm-python",
        default=str(Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"),
        help="the python of vLLM's venv (default: the checkout's .venv-vllm, which make test-vllm builds)",
    )
    p.add_argument("--our-cmd", default=f"{sys.executable} -m slora_vtc serve", help="how to start our server")
    p.add_argument(
        "--baseline", type=Path, help="also our serve from this checkout of an older revision (PYTHONPATH), as 'before'"
    )
    p.add_argument("--port", type=int, default=8180, help="ours; the others on the next five")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--pool-tokens", type=int, default=32_768)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--vllm-eager", action="store_true", help="start vLLM with --enforce-eager (no compilation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout", type=float, default=900)
    p.add_argument("--burst-timeout", type=float, default=600)
    p.add_argument(
        "--chunked",
        action="store_true",
        help="also our serve with --batching chunked (vLLM's step settings on a CPU), as 'chunked'",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="also our serve with this many torch threads (OMP_NUM_THREADS; ours picks one for a model this small)"
        " as 'threads': vLLM's model worker has one thread, its HTTP server and engine core run in other processes",
    )
    p.add_argument(
        "--engine-thread",
        action="store_true",
        help="also our serve with its engine in a thread of the server's process (serve --no-engine-process),"
        " as 'thread'",
    )
    p.add_argument("--skip-vllm", action="store_true", help="ours only (a profile run); records nothing")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    args.model = args.model.resolve()  # the servers start in a work folder of their own
    args.baseline = args.baseline.resolve() if args.baseline is not None else None
    # stopped by a signal (even started in the background, where SIGINT is ignored): stop the servers on the way out
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    model_name = args.model.name
    work = Path(tempfile.mkdtemp(prefix="serve_vs_vllm_"))
    # --prefix-cache: vLLM's prefix caching is on by default, and the burst's random prompts repeat (see above)
    ours_args = ["--pool-tokens", str(args.pool_tokens), "--dtype", args.dtype, "--scheduler", "fcfs", "--prefix-cache"]
    ours_args += ["--model", str(args.model)]
    ours = [*args.our_cmd.split(), *ours_args]
    vllm_cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model)]
    vllm_cmd += ["--served-model-name", model_name, "--host", "127.0.0.1"]
    vllm_cmd += ["--dtype", args.dtype] + (["--enforce-eager"] if args.vllm_eager else [])
    vllm_env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    vllm_env |= {"HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    # name -> (command without its port, environment, port), in the order the bursts alternate over
    this = {"PYTHONPATH": str(ROOT)}
    servers = {"ours": (ours, this, args.port)}
    if not args.skip_vllm:
        servers["vllm"] = (vllm_cmd, vllm_env, args.port + 1)
    if args.baseline is not None:
        servers["before"] = (ours, {"PYTHONPATH": str(args.baseline)}, args.port + 2)
    if args.chunked:
        servers["chunked"] = ([*ours, *CHUNKED], this, args.port + 3)
    if args.threads is not None:
        servers["threads"] = (ours, {**this, "OMP_NUM_THREADS": str(args.threads)}, args.port + 4)
    if args.engine_thread:
        servers["thread"] = ([*ours, "--no-engine-process"], this, args.port + 5)
    ports = {name: port for name, (_, _, port) in servers.items()}
    sources = {name: package_source(cmd[0], env, work) for name, (cmd, env, _) in servers.items() if name != "vllm"}
    procs: dict[str, subprocess.Popen] = {}
    started: dict[str, float] = {}
    try:
        for name, (cmd, env, port) in servers.items():
            log = work / f"{name}.log"
            procs[name] = start([*cmd, "--port", str(port)], env, log)
            started[name] = wait_ready(procs[name], port, log, args.start_timeout)
        names = list(procs)
        for name in names:  # warm-up
            burst(args, procs[name], ports[name], model_name, work, f"warmup-{name}", args.seed)
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for i in range(args.repeats):
            for name in names if i % 2 == 0 else names[::-1]:
                seed = args.seed + 1 + i  # prompts no server has seen, the same for every server in this repeat
                runs[name].append(burst(args, procs[name], ports[name], model_name, work, f"{name}-{i}", seed))
                print(f"repeat {i} {name}: {runs[name][-1]['output_throughput']:.0f} tok/s", flush=True)
    finally:
        for proc in procs.values():
            stop(proc)
    shown = (*KEPT[:6], "server_cpu_s")
    summary = {name: {k: spread([r[k] for r in rs]) for k in shown} for name, rs in runs.items()}
    print(json.dumps(summary, indent=1))
    if args.skip_vllm:
        return
    ratios = {
        name: spread([o["output_throughput"] / v["output_throughput"] for o, v in zip(runs[name], runs["vllm"])])
        for name in names
        if name != "vllm"
    }
    record = {
        "machine": machine_info(torch=_version("torch"), vllm=_vllm_version(args.vllm_python)),
        "burst": {"prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len},
        "settings": {
            "dtype": args.dtype,
            "ours": "serve " + " ".join(ours_args),
            "chunked": "serve " + " ".join([*ours_args, *CHUNKED]) if args.chunked else None,
            "threads": None if args.threads is None else f"OMP_NUM_THREADS={args.threads} serve " + " ".join(ours_args),
            "thread": "serve --no-engine-process " + " ".join(ours_args) if args.engine_thread else None,
            "vllm": " ".join([*vllm_cmd[3:], "--port", str(args.port + 1)]),
            "vllm_env": vllm_env,
            "client": "vllm bench serve --backend openai --dataset-name random --request-rate inf --ignore-eos",
        },
        "start_s": started,
        "sources": sources,
        "repeats": args.repeats,
        **summary,
        "baseline": None if args.baseline is None else str(args.baseline),
        "baseline_git": None if args.baseline is None else _git_revision(args.baseline),
        "ratio_output_throughput": ratios,
        **pairs_at(ratios),
        "target": TARGET,
        "goal": GOAL,
        "runs": runs,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for name, ratio in ratios.items():
        print(f"{name} / vLLM output tokens/s: median {ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})")


def pairs_at(ratios: dict) -> dict:
    """Per server, how many alternated pairs reached the target and the goal."""
    return {
        f"pairs_at_{name}": {server: sum(r >= level for r in ratio["all"]) for server, ratio in ratios.items()}
        for name, level in (("target", TARGET), ("goal", GOAL))
    }


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "absent"


def _git_revision(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _vllm_version(python: str) -> str:
    done = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else "unknown"


if __name__ == "__main__":
    main()
