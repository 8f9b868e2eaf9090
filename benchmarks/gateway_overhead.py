"""Gateway overhead: the latency the gateway adds to a request and to each streamed chunk, on
loopback, against calling the same upstream directly.

The upstream is a stub OpenAI server (this file, `--stub`, in its own process) that answers at
once, so that what is measured is the gateway and not a model. The gateway runs as
`slora-vtc gateway --scheduler vtc` in its own process, the client here, one request at a time
over a keep-alive connection. Direct and gateway requests alternate, and the added latency is
taken per pair (gateway minus the direct request just before it), so drift on a shared machine
cancels; p50 and p99 over the pairs. A bare pass-through proxy (`--bare`: Starlette and httpx2,
the gateway's own stack, forwarding the body and returning the answer, nothing else) is timed the
same way: the floor of what any proxy on this stack adds. Writes
benchmarks/results/gateway_overhead.json.

    .venv/bin/python benchmarks/gateway_overhead.py [--pairs 300] [--chunks 32]

Target (issue 12): under 1 ms added per request at p50.
"""

import argparse
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

RESULTS = Path(__file__).resolve().parent / "results" / "gateway_overhead.json"
TARGET_MS = 1.0
WARMUP = 30
START_TIMEOUT_S = 60


def stub_app():
    """An OpenAI-compatible server that answers at once: `max_tokens` chunks of one token each."""
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
                choice = {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length" if i == n - 1 else None}
                yield f"data: {json.dumps({**envelope, 'choices': [choice]})}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({**envelope, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


def bare_app(upstream: str):
    """A pass-through proxy with nothing but the stack: read the body, post it upstream, return the answer."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    state = {}

    async def forward(request):
        client = state.get("http") or state.setdefault("http", httpx2.AsyncClient(timeout=30))
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300, help="direct/gateway pairs per measurement (default 300)")
    parser.add_argument("--chunks", type=int, default=32, help="chunks per streamed request (default 32)")
    parser.add_argument("--stub", type=int, metavar="PORT", help=argparse.SUPPRESS)  # run the stub upstream
    parser.add_argument("--bare", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)  # run the bare proxy
    args = parser.parse_args()
    if args.stub or args.bare:
        import uvicorn

        app, port = (stub_app(), args.stub) if args.stub else (bare_app(args.bare[1]), int(args.bare[0]))
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
        return 0
    stub_port, gateway_port, bare_port = free_port(), free_port(), free_port()
    direct, gateway, bare = (f"http://127.0.0.1:{port}" for port in (stub_port, gateway_port, bare_port))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, __file__, "--stub", str(stub_port)], env=env),
        subprocess.Popen([sys.executable, __file__, "--bare", str(bare_port), direct], env=env),
    ]
    try:
        wait_ready(direct)
        wait_ready(bare)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "slora_vtc",
                    "gateway",
                    "--upstream",
                    direct,
                    "--port",
                    str(gateway_port),
                    "--scheduler",
                    "vtc",
                    "--max-inflight",
                    "64",
                    "--log-level",
                    "warning",
                ],
                env=env,
            )
        )
        wait_ready(gateway)
        result = measure(direct, gateway, bare, args.pairs, args.chunks)
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
    print(json.dumps({k: report[k] for k in ("request", "stream", "meets_target")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
