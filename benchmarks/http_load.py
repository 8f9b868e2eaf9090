"""HTTP load: 2,000 concurrent streams from 200 clients against `slora-vtc serve --model tiny` (CPU).

    .venv/bin/python benchmarks/http_load.py                  # every scenario, about 4 minutes;
                                                              # writes results/http_load.json
    .venv/bin/python benchmarks/http_load.py --only steady --runs 1 --out /tmp/x.json

Each run starts the server in a subprocess (random weights), opens every stream at once (one
connection each, X-Client-Id naming its client) and accounts for every request:

- finished: the stream ended with a finish reason and [DONE];
- refused: a 429 or 503 answer in OpenAI's error shape, with a Retry-After header;
- aborted: the server ended the stream with an error event;
- lost: anything else (connection reset or closed, timeout, a status or body of another kind).

The target is no lost request in 5 of 5 runs, steady and with the server stopped for 3 s as the
streams open (SCENARIOS lists those and two more). Recorded per run: the counts, why requests were
lost, p50 / p99 time to first token (first text chunk) over the finished streams, throughput
(generated tokens per second of the run's wall time) and the kernel's listen-queue counters.
"""

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_seconds  # noqa: E402 (benchmarks/ is not a package)

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parent.parent
TARGET = "no lost request in 5 of 5 runs"
START_TIMEOUT_S = 120


@dataclass(frozen=True)
class Load:
    streams: int = 2_000
    clients: int = 200
    prompt_tokens: int = 4
    max_tokens: int = 8
    pool_tokens: int = 20_000
    request_timeout_s: float = 120.0
    stall_s: float = 0.0  # stop the server process this long as the streams open (a blocked loop, a busy machine)


@dataclass
class Run:
    finished: int = 0
    refused: int = 0
    aborted: int = 0
    lost: int = 0
    lost_why: Counter = field(default_factory=Counter)
    refused_by_status: Counter = field(default_factory=Counter)
    ttft_s: list = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0


# -- one request ------------------------------------------------------------------------------
async def one(http: httpx2.AsyncClient, url: str, load: Load, client: str, k: int, run: Run) -> None:
    body = {
        "prompt": [1] + [3 + k % 50] * (load.prompt_tokens - 1),
        "max_tokens": load.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    start = time.perf_counter()
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Client-Id": client}) as r:
            if r.status_code in (429, 503):
                await r.aread()
                return _refusal(r, run)
            if r.status_code != 200:
                return _lost(run, f"HTTP {r.status_code}")
            await _read_stream(r, start, run)
    except httpx2.HTTPError as e:
        _lost(run, type(e).__name__)
    except OSError as e:  # below httpx2: a reset it did not wrap
        _lost(run, type(e).__name__)


def _refusal(r, run: Run) -> None:
    try:
        shaped = "message" in r.json()["error"]
    except (ValueError, KeyError, TypeError):
        shaped = False
    if not shaped or "retry-after" not in r.headers:
        return _lost(run, f"HTTP {r.status_code} without OpenAI's error shape or Retry-After")
    run.refused += 1
    run.refused_by_status[str(r.status_code)] += 1


async def _read_stream(r, start: float, run: Run) -> None:
    first, tokens, finish, error = None, 0, None, False
    async for line in r.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            error = True
            continue
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        for choice in event["choices"]:
            if choice.get("text"):
                first = first or time.perf_counter()
            finish = choice.get("finish_reason") or finish
    if error:
        run.aborted += 1
    elif finish is not None and data == "[DONE]":
        run.finished += 1
        run.tokens += tokens
        if first is not None:
            run.ttft_s.append(first - start)
    else:
        _lost(run, "stream ended without a finish reason or [DONE]")


def _lost(run: Run, why: str) -> None:
    run.lost += 1
    run.lost_why[why] += 1


# -- one run ----------------------------------------------------------------------------------
async def flood(url: str, load: Load, proc: subprocess.Popen) -> Run:
    run = Run()
    if load.stall_s:
        proc.send_signal(signal.SIGSTOP)
        asyncio.get_running_loop().call_later(load.stall_s, proc.send_signal, signal.SIGCONT)
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx2.Timeout(load.request_timeout_s)
    async with httpx2.AsyncClient(timeout=timeout, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(one(http, url, load, f"client{k % load.clients}", k, run) for k in range(load.streams)))
        run.wall_s = time.perf_counter() - start
    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, load: Load, extra: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "slora_vtc",
        "serve",
        "--model",
        "tiny",
        "--port",
        str(port),
        "--pool-tokens",
        str(load.pool_tokens),
        "--drain-timeout",
        "1",
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.communicate()[1][-2000:]}")
        try:
            if httpx2.get(f"{url}/health").status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not come up")


def one_run(load: Load, extra: list[str]) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, load, extra)
    try:
        wait_healthy(url, proc)
        before, client_cpu, server_cpu = kernel_counters(), time.process_time(), cpu_seconds(proc.pid)
        run = asyncio.run(flood(url, load, proc))
        after, client_cpu, server_cpu = (
            kernel_counters(),
            time.process_time() - client_cpu,
            cpu_seconds(proc.pid) - server_cpu,
        )
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=60)
    cpu = {
        "client_cpu_s": round(client_cpu, 2),
        "server_cpu_s": round(server_cpu, 2),
    }  # which side the run was bound by
    return {**summary(run, load), **cpu, "kernel": {k: after[k] - before[k] for k in after}}


def kernel_counters() -> dict[str, int]:
    """The kernel's listen-queue counters (whole machine): the accept queue overflowed (ListenOverflows), SYN cookies
    were sent because the SYN queue was full too, and a cookie's connection could not be made (SyncookiesFailed: the
    client's request is answered with a reset)."""
    try:
        header, values = [
            line.split() for line in Path("/proc/net/netstat").read_text().splitlines() if line.startswith("TcpExt:")
        ][:2]
    except (OSError, ValueError):
        return {}
    table = dict(zip(header[1:], map(int, values[1:])))
    return {k: table.get(k, 0) for k in ("ListenOverflows", "SyncookiesSent", "SyncookiesFailed")}


def summary(run: Run, load: Load) -> dict:
    ttft = sorted(run.ttft_s)

    def pct(q: float) -> float | None:
        return round(ttft[min(len(ttft) - 1, int(q * len(ttft)))], 4) if ttft else None

    accounted = run.finished + run.refused + run.aborted + run.lost
    assert accounted == load.streams, f"{accounted} outcomes for {load.streams} requests"
    return {
        "finished": run.finished,
        "refused": run.refused,
        "aborted": run.aborted,
        "lost": run.lost,
        "refused_by_status": dict(run.refused_by_status),
        "lost_why": dict(run.lost_why),
        "p50_ttft_s": pct(0.50),
        "p99_ttft_s": pct(0.99),
        "mean_ttft_s": round(statistics.fmean(ttft), 4) if ttft else None,
        "tokens_per_s": round(run.tokens / run.wall_s, 1),
        "wall_s": round(run.wall_s, 2),
    }


# -- the benchmark ----------------------------------------------------------------------------
def machine() -> dict:
    rev = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "httpx2": httpx2.__version__,
        "git": rev or "unknown",
    }


# name -> (what, runs, load changes, serve flags)
SCENARIOS = {
    "steady": ("the target's runs", 5, {}, []),
    "stalled": (
        "the server stopped for 3 s as the streams open (as when its event loop is blocked or the machine busy)",
        5,
        {"stall_s": 3.0},
        [],
    ),
    "bounded": (
        "small bounds, so that most requests are refused",
        1,
        {},
        ["--max-inflight", "500", "--max-waiting", "200"],
    ),
    "small backlog": (
        "stalled, with a backlog too small for the burst: where resets come from",
        1,
        {"stall_s": 3.0},
        ["--backlog", "128"],
    ),
}
TARGETED = ("steady", "stalled")


def scenario(name: str, what: str, runs: int, load: Load, extra: list[str]) -> dict:
    results = []
    for i in range(runs):
        r = one_run(load, extra)
        results.append(r)
        print(
            f"{name}, run {i + 1}: finished {r['finished']}, refused {r['refused']}, aborted {r['aborted']}, "
            f"lost {r['lost']} "
            f"{r['lost_why'] or ''}| p99 TTFT {r['p99_ttft_s']} s, {r['tokens_per_s']} tokens/s, {r['wall_s']} s | "
            f"CPU s client {r['client_cpu_s']}, server {r['server_cpu_s']} | kernel {r['kernel']}",
            flush=True,
        )
    p99 = [r["p99_ttft_s"] for r in results if r["p99_ttft_s"] is not None]
    return {
        "what": what,
        "serve_args": extra,
        "load": asdict(load),
        "runs_without_loss": sum(r["lost"] == 0 for r in results),
        "lost": sum(r["lost"] for r in results),
        "refused": sum(r["refused"] for r in results),
        "worst_p99_ttft_s": max(p99, default=None),
        "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in results),
        "runs": results,
    }


def _earlier(path: Path) -> dict:
    try:
        return json.loads(path.read_text())["scenarios"]
    except (OSError, ValueError, KeyError):
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", choices=list(SCENARIOS), action="append", help="run these scenarios only (default: all)"
    )
    parser.add_argument("--runs", type=int, help="runs per scenario (default: 5 for the targeted ones, else 1)")
    parser.add_argument("--streams", type=int, default=Load.streams)
    parser.add_argument("--clients", type=int, default=Load.clients)
    parser.add_argument("--max-tokens", type=int, default=Load.max_tokens)
    parser.add_argument("--out", type=Path, default=RESULTS / "http_load.json")
    args = parser.parse_args(argv)
    base = Load(streams=args.streams, clients=args.clients, max_tokens=args.max_tokens)
    results = _earlier(args.out) if args.only else {}  # --only replaces just those scenarios
    for name in args.only or SCENARIOS:
        what, runs, changes, extra = SCENARIOS[name]
        results[name] = scenario(name, what, args.runs or runs, replace(base, **changes), extra)
    results = {name: results[name] for name in SCENARIOS if name in results}
    checked = [results[n] for n in TARGETED if n in results]
    met = bool(checked) and all(r["runs_without_loss"] == len(r["runs"]) == 5 for r in checked)
    out = {"target": TARGET, "met": met, "machine": machine(), "scenarios": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name in TARGETED:
        if name in results:
            done = results[name]
            print(f"{name}: {done['runs_without_loss']} of {len(done['runs'])} runs without a lost request")
    print(f"target ({TARGET}): {'met' if met else 'not met'} -> {args.out}")
    return 0 if met or not checked or args.runs not in (None, 5) else 1


if __name__ == "__main__":
    sys.exit(main())
