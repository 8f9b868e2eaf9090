"""The gateway's FastAPI application: the relayed endpoints, /v1/models, /health, /metrics, and
errors in OpenAI's shape (404s and 405s included)."""

import asyncio
import json
from contextlib import asynccontextmanager, suppress

import httpx2
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from slora_vtc.gateway.api import CHAT, COMPLETIONS, GENERATE, GENERATE_STREAM, ApiKind
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.dispatcher import Busy
from slora_vtc.gateway.metrics import render
from slora_vtc.gateway.monitor import monitor
from slora_vtc.gateway.proxy import forward
from slora_vtc.gateway.transport import AiohttpTransport
from slora_vtc.serving.connection import bears_key, identify
from slora_vtc.serving.errors import ApiError, api_error_handler, http_error_handler
from slora_vtc.serving.limits import BodyLimit

KEEPALIVE_EXPIRY_S = 2.0
PASSED_THROUGH = (("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/version"))  # vLLM's; not scheduled


def create_app(ctx: GatewayContext) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        timeout = httpx2.Timeout(ctx.config.upstream_timeout_s, connect=ctx.config.connect_timeout_s)
        # idle connections expire before the upstream's keep-alive does (uvicorn's and vLLM's: 5 s), so that
        # a request is never sent on a connection the upstream is closing
        transport = AiohttpTransport(keepalive_expiry=KEEPALIVE_EXPIRY_S)
        key = ctx.config.upstream_api_key
        headers = (
            {"authorization": f"Bearer {key}"} if key else None
        )  # model lists and probes too, not only relayed requests
        async with httpx2.AsyncClient(timeout=timeout, transport=transport, headers=headers) as http:
            ctx.http = http
            probes = asyncio.create_task(monitor(ctx))
            try:
                yield
            finally:
                probes.cancel()
                with suppress(asyncio.CancelledError):
                    await probes

    app = FastAPI(title="slora_vtc gateway", lifespan=lifespan)
    app.state.ctx = ctx
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(HTTPException, http_error_handler)
    app.add_middleware(BodyLimit, limit=ctx.config.max_body_bytes)
    for kind in (COMPLETIONS, CHAT, GENERATE, GENERATE_STREAM):
        app.add_route(
            kind.path, _relay_route(kind), methods=["POST"], name=kind.name
        )  # plain Starlette: no dependency solving per request
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", model, methods=["GET"])
    for method, path in PASSED_THROUGH:
        app.add_route(path, _passthrough(path), methods=[method])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    return app


def _relay_route(kind: ApiKind):
    async def route(http: Request) -> Response:
        ctx: GatewayContext = http.app.state.ctx
        body = _json_object(await http.body())
        routing = kind.route(body)
        return await forward(ctx, kind, body, routing, _client(ctx, http, routing.user), http)

    return route


def _json_object(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, f"the body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _client(ctx: GatewayContext, http: Request, user: str | None) -> str:
    """As `serve` identifies clients (serving/connection.py): the API key's, else X-Client-Id, else `user`."""
    return identify(ctx.clients, http.headers, user).name


async def models(http: Request) -> dict:
    """Every model some upstream serves (each listed once, from the first upstream that has it)."""
    ctx: GatewayContext = http.app.state.ctx
    replies = await asyncio.gather(
        *(ctx.http.get(f"{u.url}/v1/models") for u in ctx.pool.upstreams if u.up), return_exceptions=True
    )
    cards: dict[str, dict] = {}
    for reply in replies:
        if isinstance(reply, httpx2.Response) and reply.status_code == 200:
            with suppress(ValueError, KeyError, TypeError):
                for card in reply.json()["data"]:
                    cards.setdefault(card["id"], card)
    if not cards:
        raise ApiError(502, "no upstream answered /v1/models", "server_error", "upstream_error")
    return {"object": "list", "data": list(cards.values())}


async def model(model_id: str, http: Request) -> Response:
    """The first upstream that serves the model answers for it; a 404 if none does."""
    ctx: GatewayContext = http.app.state.ctx
    for upstream in (u for u in ctx.pool.upstreams if u.up):
        with suppress(httpx2.HTTPError):
            reply = await ctx.http.get(f"{upstream.url}/v1/models/{model_id}")
            if reply.status_code == 200:
                return Response(reply.content, media_type="application/json")
    raise ApiError(404, f"the model '{model_id}' does not exist on any upstream", "not_found_error", "model_not_found")


def _passthrough(path: str):
    """A request no scheduler needs to see (it generates nothing): sent to the first upstream that is up."""

    async def route(http: Request) -> Response:
        ctx: GatewayContext = http.app.state.ctx
        upstream = next((u for u in ctx.pool.upstreams if u.up), None)
        if upstream is None:
            raise Busy(503, "no upstream is available", "server_error", "upstream_unavailable")
        try:
            reply = await ctx.http.request(
                http.method,
                upstream.url + path,
                content=await http.body(),
                headers={"content-type": http.headers.get("content-type", "application/json")},
            )
        except httpx2.HTTPError as e:
            raise ApiError(
                502, f"upstream {upstream.url} failed ({type(e).__name__}: {e})", "server_error", "upstream_error"
            ) from None
        return Response(reply.content, status_code=reply.status_code, media_type=reply.headers.get("content-type"))

    return route


async def health(http: Request) -> JSONResponse:
    ctx: GatewayContext = http.app.state.ctx
    ok = ctx.pool.any_up
    body = {
        "status": "ok" if ok else "unavailable",
        "scheduler": ctx.config.scheduler,
        "upstreams": [{"url": u.url, "up": u.up, "inflight": u.inflight, "limit": u.limit} for u in ctx.pool.upstreams],
    }
    if ctx.models:
        body["model"] = ctx.models[0]
    return JSONResponse(body, status_code=200 if ok else 503)


async def metrics(http: Request) -> Response:
    ctx: GatewayContext = http.app.state.ctx
    if ctx.config.metrics_key and not bears_key(http, ctx.config.metrics_key):
        raise ApiError(401, "GET /metrics needs 'Authorization: Bearer KEY' (--metrics-key)", "authentication_error")
    return Response(render(ctx), media_type=CONTENT_TYPE_LATEST)
