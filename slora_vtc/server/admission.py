"""What the server takes on: how much work at once, which adapters a client may name, and how it says no.

Two bounds keep an overloaded server answering rather than queueing without end:

- in flight (`--max-inflight`): generation requests handled over HTTP at once, from their first
  byte in to their last byte out. Beyond it a request is refused before its body is parsed (this
  middleware), so a flood costs neither memory for bodies nor tokenization.
- waiting (`--max-waiting`): requests queued in the scheduler. The engine thread refuses beyond it
  (EngineService._add), where the queue's length is exact.

Every refusal is answered in OpenAI's error shape with a Retry-After header: 503 for these two
bounds, 429 for a client over its RPM limit, and counts as a rejected request of its client.
An adapter is named, never given as a path (see clients.py for who may name which).
uvicorn's own `limit_concurrency` is not used: its 503 is plain text, and it counts idle
keep-alive connections as if they were requests.
"""

import math

from fastapi.responses import JSONResponse
from starlette.requests import Request as HttpRequest

from slora_vtc.server.context import ServerContext
from slora_vtc.server.deps import caller
from slora_vtc.server.service import QUEUE_FULL, SHUTTING_DOWN, EngineService, ServiceStopped
from slora_vtc.serving.clients import ClientConfig
from slora_vtc.serving.errors import ApiError, error_body

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/generate", "/generate_stream"})
OVERLOAD_RETRY_S = 1  # a full server frees slots within a few decode steps
RPM_WINDOW_S = 60


def check_adapter(ctx: ServerContext, client: ClientConfig, adapter: str) -> None:
    """Only a served adapter, by name (never a path: nothing is loaded for a request), and with API keys
    only one the client's entry allows."""
    if adapter not in ctx.adapters:
        known = ", ".join(ctx.adapters.names) or "none: this server was started without --lora or --dummy-adapters"
        raise ApiError(400, f"unknown LoRA adapter '{adapter}' (known: {known})")
    allowed = ctx.clients.allowed_adapters(client)
    if allowed is not None and adapter not in allowed:
        raise ApiError(
            403,
            f"client '{client.name}' may not use the LoRA adapter '{adapter}' (its clients-file entry allows: "
            f"{', '.join(allowed) or 'none'})",
            "permission_error",
            "adapter_not_allowed",
        )


def overloaded(message: str) -> ApiError:
    return ApiError(503, message, "service_unavailable", "overloaded", headers={"Retry-After": str(OVERLOAD_RETRY_S)})


def refusal(ctx: ServerContext, client: str, reason: str) -> ApiError:
    """The answer to a request the engine refused at arrival (its Ended event's reason)."""
    if reason == QUEUE_FULL:
        return overloaded(f"request refused: {reason}; retry later")
    if reason == SHUTTING_DOWN or not ctx.service.healthy:
        return ApiError(503, reason, "service_unavailable")
    rpm = ctx.clients.named.get(client, ctx.clients.default).rpm
    retry_s = math.ceil(RPM_WINDOW_S / rpm) if rpm else OVERLOAD_RETRY_S  # about when the window lets one more in
    return ApiError(
        429, f"request refused: {reason}", "rate_limit_error", "rate_limited", headers={"Retry-After": str(retry_s)}
    )


class InflightLimit:
    """ASGI middleware: at most `ctx.config.max_inflight` generation requests at once (only the event loop
    touches the count); the others get a 503 with Retry-After before their body is parsed. A refusal is counted for
    the client the headers name (a client known only by the body's `user` counts as anonymous)."""

    def __init__(self, app, ctx: ServerContext):
        self.app, self.ctx = app, ctx
        self.limit = ctx.config.max_inflight
        self.inflight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            return await self.app(scope, receive, send)
        if self.inflight >= self.limit:
            return await self._refuse(scope, receive, send)
        self.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1

    async def _refuse(self, scope, receive, send) -> None:
        await _discard_body(receive, self.ctx.config.max_body_bytes)
        _count_rejected(self.ctx.service, _client_of(scope))
        exc = overloaded(f"request refused: {self.limit} requests are in flight (--max-inflight); retry later")
        response = JSONResponse(
            error_body(exc.message, exc.kind, exc.code), status_code=exc.status, headers=exc.headers
        )
        await response(scope, receive, send)


async def _discard_body(receive, limit: int) -> None:
    """Read the body (up to `limit` bytes) before answering, so the request is complete and its connection
    ready for the next one (answering first cost the client of benchmarks/http_load.py's bounded run about
    half again as much CPU). Beyond the limit the connection is not reusable anyway."""
    size = 0
    while size <= limit:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _client_of(scope) -> str | None:
    """The client, as far as the headers tell (API key, X-Client-Id); None for a bad key or name."""
    try:
        return caller(HttpRequest(scope)).client().name
    except ApiError:
        return None  # not a request the server would serve anyway: nothing to count


def _count_rejected(service: EngineService, client: str | None) -> None:
    if client is None:
        return
    try:
        service.count_rejected(client)
    except ServiceStopped:
        pass  # shutting down: the numbers are final
