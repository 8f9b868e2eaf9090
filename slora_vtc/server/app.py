"""The FastAPI application: routes, error format, health and metrics, and the engine's lifetime.

The engine thread starts with the application and stops with it: uvicorn first lets in-flight
responses finish (up to the drain timeout, then cancels them, which aborts their requests), then
the lifespan's exit aborts whatever is left and joins the thread.
"""

import asyncio
from collections import Counter
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from slora_vtc.server import openai_api, openapi, slora_api, utility_api
from slora_vtc.server.admission import InflightLimit
from slora_vtc.server.context import ServerContext
from slora_vtc.server.deps import ContextDep
from slora_vtc.server.http_metrics import PrometheusText, StatusCounter, metrics
from slora_vtc.serving.errors import (
    ApiError,
    api_error_handler,
    error_body,
    error_responses,
    http_error_handler,
    validation_message,
)
from slora_vtc.serving.limits import BodyLimit


def create_app(ctx: ServerContext) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx.service.start()
        try:
            yield
        finally:
            await asyncio.to_thread(ctx.service.shutdown)

    app = FastAPI(title="slora_vtc", lifespan=lifespan)
    app.state.ctx = ctx
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, http_error_handler)  # 404, 405: OpenAI's shape too
    app.add_middleware(BodyLimit, limit=ctx.config.max_body_bytes)
    app.add_middleware(InflightLimit, ctx=ctx)  # outside the body limit: a refusal reads no body
    app.include_router(openai_api.router)
    app.include_router(slora_api.router)
    app.include_router(utility_api.router)
    app.add_api_route("/health", health, methods=["GET"], responses={503: {"description": "the engine has stopped"}})
    app.add_api_route(
        "/metrics", metrics, methods=["GET"], response_class=PrometheusText, responses=error_responses(401)
    )
    openapi.install(app, ctx)
    app.state.http_counts = Counter()
    routes = [
        *openai_api.router.routes,
        *slora_api.router.routes,
        *utility_api.router.routes,
        *(r for r in app.router.routes if hasattr(r, "path")),
    ]
    app.add_middleware(StatusCounter, counts=app.state.http_counts, routes=routes)  # outermost: counts the 413s too
    return app


async def health(ctx: ContextDep) -> JSONResponse:
    ok = ctx.service.healthy
    body = {
        "status": "ok" if ok else "unavailable",
        "model": ctx.model_name,
        "scheduler": ctx.config.scheduler,
        "pool_tokens": ctx.engine_config.pool_tokens,
    }
    if ctx.service.error:
        body["error"] = ctx.service.error
    return JSONResponse(body, status_code=200 if ok else 503)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 from FastAPI becomes a 400 with one readable line per problem (as OpenAI answers)."""
    return JSONResponse(error_body(validation_message(exc.errors()), "invalid_request_error"), status_code=400)
