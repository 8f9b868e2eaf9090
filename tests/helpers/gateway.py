"""Helpers for the gateway tests: our own `serve` as upstreams (killable), and the gateway itself,
each a real uvicorn server on 127.0.0.1 in a background thread."""

import json
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import httpx2
import uvicorn

from slora_vtc.gateway.config import GatewayConfig
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.run import build_context as build_gateway
from slora_vtc.gateway.run import server_for as gateway_server
from slora_vtc.server.context import ServerConfig, build_context
from slora_vtc.server.run import server_for
from tests.helpers.server import Running, serve_in_thread

START_TIMEOUT_S = 30
CHUNK = {"id": "c", "object": "text_completion", "created": 0, "model": "fake"}  # a fake stream chunk, less its choices


@dataclass(frozen=True)
class Upstream(Running):
    server: uvicorn.Server = None
    thread: threading.Thread = None

    def kill(self) -> None:
        """Stop at once: no draining (in-flight streams are cut or aborted)."""
        self.server.force_exit = True
        self.server.should_exit = True
        self.ctx.service.stop(0)
        self.thread.join(timeout=30)


@contextmanager
def upstream(**settings):
    """Our own `serve` (tiny model by default) as an upstream; `.kill()` stops it mid-run."""
    ctx = build_context(ServerConfig(**settings))
    server = server_for(ctx, host="127.0.0.1", log_level="critical")
    with serve_in_thread(server) as (url, thread):
        yield Upstream(url, ctx, server, thread)


@dataclass(frozen=True)
class Gateway:
    url: str
    ctx: GatewayContext

    def metrics(self) -> dict[str, float]:
        values = {}
        for line in httpx2.get(f"{self.url}/metrics").text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                values[key] = float(value)
        return values

    def per(self, name: str, label: str = "client") -> dict[str, float]:
        pattern = re.compile(rf'^slora_gateway_{name}\{{{label}="([^"]*)"\}}$')
        return {m.group(1): v for k, v in self.metrics().items() if (m := pattern.match(k))}

    def wait_idle(self, timeout_s: float = 20.0) -> dict[str, float]:
        """Metrics once nothing waits and nothing is in flight on any upstream (or fail)."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            busy = m["slora_gateway_waiting"] + sum(
                v
                for k, v in m.items()
                if k.startswith(("slora_gateway_upstream_inflight", "slora_gateway_client_inflight"))
            )
            if not busy:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"the gateway did not become idle: {m}")
            time.sleep(0.02)


@contextmanager
def gateway(*upstream_urls: str, **settings):
    """The gateway (GatewayConfig(**settings)) in front of the given upstreams."""
    ctx = build_gateway(GatewayConfig(upstreams=tuple(upstream_urls), **settings))
    with serve_in_thread(gateway_server(ctx, log_level="critical")) as (url, _):
        yield Gateway(url, ctx)


class FakeUpstream:
    """An OpenAI-compatible stand-in whose timing the test controls: it records every body (and
    the headers) it gets, streams one chunk per token (max_tokens of them, "x" each, or `output_tokens`),
    holds its streams after `hold_after` chunks (and its whole answers) until `release` is set, and
    with `hang` never answers at all. `break_after` chunks, a stream ends with `breaks`: "event" (an
    error event, then [DONE], as vLLM and `serve` send), "cut" (the connection drops), "half" (half an
    event's line, then the end) or "end" (it ends without [DONE])."""

    def __init__(
        self,
        hold_after: int | None = None,
        hang: bool = False,
        prompt_tokens: int = 7,
        vllm_metrics: bool = False,
        output_tokens: int | None = None,
        break_after: int | None = None,
        breaks: str = "event",
    ):
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.vllm_metrics = vllm_metrics
        self.queued = 0  # what /metrics reports as vllm:num_requests_waiting (with vllm_metrics)
        self.release = threading.Event()
        self.hold_after, self.hang, self.prompt_tokens = hold_after, hang, prompt_tokens
        self.output_tokens, self.break_after, self.breaks = output_tokens, break_after, breaks

    def app(self):
        import asyncio

        from fastapi import FastAPI, Request
        from fastapi.responses import StreamingResponse

        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake", "object": "model", "created": 0, "owned_by": "test"}]}

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        @app.get("/metrics")
        async def metrics():
            from fastapi.responses import PlainTextResponse

            if not self.vllm_metrics:
                return PlainTextResponse("# TYPE other_metric gauge\nother_metric 1.0\n")
            return PlainTextResponse(
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{model_name="fake"}} {self.queued}\n'
                "# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{model_name="fake"} 0.0\n'
            )

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            if self.hang:
                await asyncio.sleep(3600)
            n = self.output_tokens or body.get("max_tokens", 16)
            usage = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": n,
                "total_tokens": self.prompt_tokens + n,
            }
            if not body.get("stream"):
                while self.hold_after is not None and not self.release.is_set():
                    await asyncio.sleep(0.005)
                return {
                    "id": "c",
                    "object": "text_completion",
                    "created": 0,
                    "model": "fake",
                    "choices": [{"index": 0, "text": "x" * n, "logprobs": None, "finish_reason": "length"}],
                    "usage": usage,
                }

            async def chunks():
                for i in range(n):
                    if i == self.break_after:
                        if self.breaks == "cut":
                            raise ConnectionResetError("the fake upstream cuts the stream")
                        if self.breaks == "half":  # dies in the middle of an event: half a data line
                            yield 'data: {"id": "cmpl-fake", "choices": [{"index": 0, "text": "'
                            return
                        if self.breaks == "event":
                            error = {"message": "the fake upstream broke", "type": "server_error"}
                            yield f"data: {json.dumps({'error': error})}\n\n"
                            yield "data: [DONE]\n\n"
                        return
                    if self.hold_after is not None and i == self.hold_after:
                        while not self.release.is_set():
                            await asyncio.sleep(0.005)
                    choice = {
                        "index": 0,
                        "text": "x",
                        "logprobs": None,
                        "finish_reason": "length" if i == n - 1 else None,
                    }
                    yield f"data: {json.dumps({**CHUNK, 'choices': [choice]})}\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({**CHUNK, 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")

        return app


@contextmanager
def fake_upstream(fake: FakeUpstream):
    server = uvicorn.Server(uvicorn.Config(fake.app(), host="127.0.0.1", log_level="critical", lifespan="off"))
    with serve_in_thread(server) as (url, _):
        try:
            yield url
        finally:
            fake.release.set()
            server.force_exit = True


def wait_for(predicate, timeout_s: float = 20.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
