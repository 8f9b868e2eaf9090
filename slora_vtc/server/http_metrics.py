"""HTTP requests counted by route template and status code (bounded labels), and GET /metrics.

The counts live on the event loop (only the middleware writes them); /metrics copies them there,
takes the engine's snapshot between two steps, and renders both in a worker thread, so a scrape
blocks neither the engine nor the event loop. With `metrics_key` set, /metrics needs
'Authorization: Bearer KEY' (it names clients): a 401 in OpenAI's shape otherwise.
"""

import asyncio
from collections import Counter

from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.routing import Match

from slora_vtc import __version__
from slora_vtc.server.deps import ContextDep
from slora_vtc.server.metrics import BuildInfo, render
from slora_vtc.serving.connection import bears_key
from slora_vtc.serving.errors import ApiError


class PrometheusText(Response):
    media_type = CONTENT_TYPE_LATEST  # Prometheus' text format (what the schema says /metrics answers)


UNMATCHED = "unmatched"  # the route label of paths no route serves (404s): never the raw path


class StatusCounter:
    """ASGI middleware: `counts[(route template, status)] += 1` for every response started.
    The template is the route the router chose, else (a response before routing, such as a 413)
    the first of `routes` whose path matches."""

    def __init__(self, app, counts: Counter, routes: list):
        self.app, self.counts, self.routes = app, counts, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.counts[(self._route(scope), str(message["status"]))] += 1
            await send(message)

        await self.app(scope, receive, counting_send)

    def _route(self, scope) -> str:
        chosen = getattr(scope.get("route"), "path", None)
        if chosen is not None:
            return chosen
        for route in self.routes:
            if route.matches(scope)[0] is not Match.NONE:
                return route.path
        return UNMATCHED


async def metrics(request: Request, ctx: ContextDep) -> Response:
    key = ctx.config.metrics_key
    if key is not None and not bears_key(request, key):
        raise ApiError(
            401,
            "GET /metrics needs 'Authorization: Bearer KEY' with the server's --metrics-key",
            "authentication_error",
            "invalid_api_key",
        )
    snap = await asyncio.wrap_future(ctx.service.snapshot())
    http = dict(request.app.state.http_counts)
    build = BuildInfo(__version__, ctx.config.scheduler, ctx.model_name)
    return PrometheusText(await asyncio.to_thread(render, snap, build, http, ctx.service.engine_pid))
