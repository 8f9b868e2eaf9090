"""Gateway overhead: the latency the gateway adds to a request and to each streamed chunk, on
loopback, against calling the same upstream directly.

The upstream is a stub OpenAI server (this file, `--stub`, in its own process) that answers at
once, so that what is measured is the gateway and not a model. The gateway runs as
`slora-vtc gateway --scheduler vtc` in its own process, the client here, one request at a time
over a keep-alive connection. Direct and gateway requests alternate, and the added latency is
taken per pair (gateway minus the direct request just before it), so drift on a shared machine
cancels; p50 and p99 over the pairs. A bare pass-through proxy (`--bare`: Starlette and httpx2 on
aiohttp's connections, the gateway's own stack, forwarding the body and returning the answer,
nothing else) is timed the same way: the floor of what any proxy on this stack adds.

Beside the latencies, the CPU the gateway spends relaying a stream (what competes with a model on
the same cores, issue 19): a second stub process sends each chunk `--gap` seconds after the one
before (a model's decode step), `--streams` clients stream through the gateway at once, and the
CPU seconds of the gateway process (and of the stub, what an OpenAI server itself spends to send
a chunk) are divided by the chunks the clients received; the same gateway on asyncio's own event
loop (instead of uvloop, which uvicorn picks where it is installed), and on httpx2's own transport
(instead of aiohttp's connections, slora_vtc/gateway/transport.py: the gateway before 2026-12-05),
are measured alike, in alternating rounds. Writes
benchmarks/results/gateway_overhead.json.

    .venv/bin/python benchmarks/gateway_overhead.py [--pairs 300] [--chunks 32] [--streams 8]

Target (issue 12): under 1 ms added per request at p50.
"""

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_seconds  # noqa: E402 (benchmarks/ is not a package)

RESULTS = Path(__file__).resolve().parent / "results" / "gateway_overhead.json"
TARGET_MS = 1.0
WARMUP = 30
START_TIMEOUT_S = 60
RELAY_REQUESTS = 6  # streamed requests per client for the relay's CPU, in each round
RELAY_ROUNDS = 3
RELAY_CHUNKS = 128


def stub_app(gap_s: float = 0.0):
    """An OpenAI-compatible server that answers `max_tokens` chunks of one token each, at once or
    each `gap_s` seconds after the one before."""
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "stub", "object": "model", "created": 0, "owned_by": "bench"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        n = body.get("max_tokens", 16)
        usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
        envelope = {"id": "c", "object": "text_completion", "created": 0, "model": "stub"}
        if not body.get("stream"):
            return {
                **envelope,
                "choices": [{"index": 0, "text": "x" * n, "logprobs": None, "finish_reason": "length"}],
                "usage": usage,
            }

        async def chunks():
            for i in range(n):
                if gap_s:
                    await asyncio.sleep(gap_s)
                choice = {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length" if i == n - 1 else None}
                yield f"data: {json.dumps({**envelope, 'choices': [choice]})}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({**envelope, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


def bare_app(upstream: str):
    """A pass-through proxy with nothing but the gateway's stack (its transport included): read the body,
    post it upstream, return the answer."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from slora_vtc.gateway.app import KEEPALIVE_EXPIRY_S
    from slora_vtc.gateway.transport import AiohttpTransport

    state = {}

    async def forward(request):
        client = state.get("http") or state.setdefault(
            "http", httpx2.AsyncClient(timeout=30, transport=AiohttpTransport(keepalive_expiry=KEEPALIVE_EXPIRY_S))
        )
        reply = await client.post(
            f"{upstream}/v1/completions", content=await request.body(), headers={"content-type": "application/json"}
        )
        return Response(reply.content, status_code=reply.status_code, media_type="application/json")

    async def health(request):
        return Response("ok")

    return Starlette(routes=[Route("/v1/completions", forward, methods=["POST"]), Route("/health", health)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def timed_request(http: httpx2.Client, url: str, body: dict) -> float:
    start = time.perf_counter()
    reply = http.post(f"{url}/v1/completions", json=body)
    reply.raise_for_status()
    return time.perf_counter() - start


def timed_stream(http: httpx2.Client, url: str, body: dict, chunks: int) -> tuple[float, float]:
    """(time to the first chunk, time to the end of the stream)."""
    start, first, seen = time.perf_counter(), None, 0
    with http.stream("POST", f"{url}/v1/completions", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                first = first or time.perf_counter() - start
    assert seen == chunks, f"{seen} chunks, expected {chunks}"
    return first, time.perf_counter() - start


def percentiles_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1e3, 4),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3, 4),
    }


def measure(direct: str, gateway: str, bare: str, pairs: int, chunks: int) -> dict:
    whole = {"prompt": "hello", "max_tokens": 16}
    stream = {"prompt": "hello", "max_tokens": chunks, "stream": True}
    with httpx2.Client(timeout=30) as http:
        for _ in range(WARMUP):
            timed_request(http, direct, whole), timed_request(http, gateway, whole), timed_request(http, bare, whole)
            timed_stream(http, direct, stream, chunks), timed_stream(http, gateway, stream, chunks)
        req_direct, req_added = [], []
        for _ in range(pairs):
            d = timed_request(http, direct, whole)
            req_direct.append(d)
            req_added.append(timed_request(http, gateway, whole) - d)
        bare_added = []
        for _ in range(pairs):
            d = timed_request(http, direct, whole)
            bare_added.append(timed_request(http, bare, whole) - d)
        first_added, chunk_added, stream_direct = [], [], []
        for _ in range(pairs):
            d_first, d_total = timed_stream(http, direct, stream, chunks)
            g_first, g_total = timed_stream(http, gateway, stream, chunks)
            stream_direct.append(d_total)
            first_added.append(g_first - d_first)
            chunk_added.append(((g_total - g_first) - (d_total - d_first)) / max(1, chunks - 1))
    return {
        "request": {"direct": percentiles_ms(req_direct), "added": percentiles_ms(req_added)},
        "bare_proxy": {"added": percentiles_ms(bare_added)},
        "stream": {
            "chunks": chunks,
            "direct_total": percentiles_ms(stream_direct),
            "added_first_chunk": percentiles_ms(first_added),
            "added_per_later_chunk": percentiles_ms(chunk_added),
        },
    }


async def stream_all(url: str, streams: int, requests_each: int, chunks: int) -> int:
    """`streams` clients each streaming `requests_each` requests of `chunks` chunks; the chunks received."""
    received = 0
    body = {"prompt": "hello", "max_tokens": chunks, "stream": True}

    async def client(http: httpx2.AsyncClient, name: str) -> None:
        nonlocal received
        for _ in range(requests_each):
            async with http.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Client-Id": name}) as reply:
                reply.raise_for_status()
                async for line in reply.aiter_lines():
                    received += line.startswith("data: {")

    async with httpx2.AsyncClient(timeout=60) as http:
        await asyncio.gather(*(client(http, f"tenant{i % 2}") for i in range(streams)))
    return received


def relay_cpu(gateway: str, gateway_pid: int, stub_pid: int, streams: int, chunks: int) -> tuple[float, float]:
    """CPU microseconds per relayed chunk, of the gateway and of the stub upstream, over a load of
    `streams` clients (after one round of warm-up)."""
    asyncio.run(stream_all(gateway, streams, 1, chunks))
    gateway_cpu, stub_cpu = cpu_seconds(gateway_pid), cpu_seconds(stub_pid)
    received = asyncio.run(stream_all(gateway, streams, RELAY_REQUESTS, chunks))
    gateway_cpu, stub_cpu = cpu_seconds(gateway_pid) - gateway_cpu, cpu_seconds(stub_pid) - stub_cpu
    return gateway_cpu / received * 1e6, stub_cpu / received * 1e6


def relay_cpus(gateways: dict[str, tuple[str, int]], stub_pid: int, args) -> dict:
    """relay_cpu of each gateway (name: (url, pid)), in alternating rounds; the medians."""
    samples: dict[str, list[float]] = {name: [] for name in gateways}
    upstream = []
    for _ in range(RELAY_ROUNDS):
        for name, (url, pid) in gateways.items():
            gateway_us, stub_us = relay_cpu(url, pid, stub_pid, args.streams, RELAY_CHUNKS)
            samples[name].append(gateway_us)
            upstream.append(stub_us)
    return {
        "streams": args.streams,
        "chunks_per_request": RELAY_CHUNKS,
        "gap_ms": args.gap * 1e3,
        "rounds": RELAY_ROUNDS,
        **{f"{name}_us_per_chunk": round(statistics.median(v), 1) for name, v in samples.items()},
        "upstream_us_per_chunk": round(statistics.median(upstream), 1),
    }


def start_gateway(upstream: str, port: int, env: dict, loop: str = "", transport: str = "aiohttp") -> subprocess.Popen:
    """`slora-vtc gateway --scheduler vtc` in front of `upstream`; given a `loop` (or `transport`), the
    same gateway on that asyncio event loop instead of the one uvicorn picks (uvloop where it is
    installed), and on that transport to its upstream (`httpx2`: httpx2's own)."""
    if loop or transport != "aiohttp":
        command = [sys.executable, __file__, "--gateway-on", loop or "auto", transport, str(port), upstream]
        return subprocess.Popen(command, env=env)
    command = [sys.executable, "-m", "slora_vtc", "gateway", "--upstream", upstream, "--port", str(port)]
    command += ["--scheduler", "vtc", "--max-inflight", "64", "--log-level", "warning"]
    return subprocess.Popen(command, env=env)


def run_gateway_on(loop: str, transport: str, port: int, upstream: str) -> None:
    from slora_vtc.gateway import app
    from slora_vtc.gateway.config import GatewayConfig
    from slora_vtc.gateway.run import build_context, server_for

    if transport == "httpx2":  # the gateway as it was: httpx2's own connections (h11), without Nagle
        app.AiohttpTransport = lambda keepalive_expiry: httpx2.AsyncHTTPTransport(
            limits=httpx2.Limits(
                max_connections=None, max_keepalive_connections=None, keepalive_expiry=keepalive_expiry
            ),
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
    config = GatewayConfig(upstreams=(upstream,), port=port, scheduler="vtc", max_inflight=64, log_level="warning")
    server_for(build_context(config), loop=loop).run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300, help="direct/gateway pairs per measurement (default 300)")
    parser.add_argument("--chunks", type=int, default=32, help="chunks per streamed request (default 32)")
    parser.add_argument("--streams", type=int, default=8, help="streams at once for the relay's CPU (default 8)")
    parser.add_argument("--gap", type=float, default=0.004, help="seconds between a stream's chunks (default 0.004)")
    parser.add_argument("--stub", type=int, metavar="PORT", help=argparse.SUPPRESS)  # run the stub upstream
    parser.add_argument("--bare", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)  # run the bare proxy
    parser.add_argument(
        "--gateway-on", nargs=4, metavar=("LOOP", "TRANSPORT", "PORT", "UPSTREAM"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.gateway_on:
        loop, transport, port, upstream = args.gateway_on
        run_gateway_on(loop, transport, int(port), upstream)
        return 0
    if args.stub or args.bare:
        import uvicorn

        app, port = (stub_app(args.gap), args.stub) if args.stub else (bare_app(args.bare[1]), int(args.bare[0]))
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
        return 0
    ports = [free_port() for _ in range(7)]
    direct, gateway, bare, paced, relay, relay_asyncio, relay_httpx2 = (f"http://127.0.0.1:{port}" for port in ports)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, __file__, "--stub", str(ports[0]), "--gap", "0"], env=env),
        subprocess.Popen([sys.executable, __file__, "--bare", str(ports[2]), direct], env=env),
        subprocess.Popen([sys.executable, __file__, "--stub", str(ports[3]), "--gap", str(args.gap)], env=env),
    ]
    try:
        for url in (direct, bare, paced):
            wait_ready(url)
        procs += [start_gateway(direct, ports[1], env), start_gateway(paced, ports[4], env)]
        procs.append(start_gateway(paced, ports[5], env, loop="asyncio"))
        procs.append(start_gateway(paced, ports[6], env, transport="httpx2"))
        for url in (gateway, relay, relay_asyncio, relay_httpx2):
            wait_ready(url)
        result = measure(direct, gateway, bare, args.pairs, args.chunks)
        relays = {
            "gateway": (relay, procs[4].pid),
            "gateway_asyncio": (relay_asyncio, procs[5].pid),
            "gateway_httpx2_transport": (relay_httpx2, procs[6].pid),
        }
        result["relay_cpu"] = relay_cpus(relays, procs[2].pid, args)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    added = result["request"]["added"]["p50_ms"]
    report = {
        "benchmark": "gateway_overhead",
        "pairs": args.pairs,
        "target_p50_ms": TARGET_MS,
        "meets_target": added < TARGET_MS,
        **result,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("request", "stream", "relay_cpu", "meets_target")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
