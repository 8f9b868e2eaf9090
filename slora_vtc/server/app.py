"""The FastAPI application: routes, error format, health and metrics, and the engine's lifetime.

The engine thread starts with the application and stops with it: uvicorn first lets in-flight
responses finish (up to the drain timeout, then cancels them, which aborts their requests), then
the lifespan's exit aborts whatever is left and joins the thread.
"""

import asyncio
from collections import Counter
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from slora_vtc.server import openai_api, slora_api, utility_api
from slora_vtc.server.context import ServerContext
from slora_vtc.server.deps import context
from slora_vtc.server.errors import ApiError, error_body
from slora_vtc.server.http_metrics import StatusCounter, metrics
from slora_vtc.server.limits import BodyLimit


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
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)  # 404, 405: OpenAI's shape too
    app.add_middleware(BodyLimit, limit=ctx.config.max_body_bytes)
    app.include_router(openai_api.router)
    app.include_router(slora_api.router)
    app.include_router(utility_api.router)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.state.http_counts = Counter()
    routes = [*openai_api.router.routes, *slora_api.router.routes, *utility_api.router.routes,
              *(r for r in app.router.routes if hasattr(r, "path"))]
    app.add_middleware(StatusCounter, counts=app.state.http_counts, routes=routes)  # outermost: counts the 413s too
    return app


async def health(ctx: ServerContext = Depends(context)) -> JSONResponse:
    ok = ctx.service.healthy
    body = {"status": "ok" if ok else "unavailable", "model": ctx.model_name, "scheduler": ctx.config.scheduler,
            "pool_tokens": ctx.engine_config.pool_tokens}
    if ctx.service.error:
        body["error"] = ctx.service.error
    return JSONResponse(body, status_code=200 if ok else 503)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.kind, exc.code), status_code=exc.status)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code, headers=exc.headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 from FastAPI becomes a 400 with one readable line per problem (as OpenAI answers)."""
    return JSONResponse(error_body("; ".join(_problem(e) for e in exc.errors()), "invalid_request_error"), status_code=400)


def _problem(error: dict) -> str:
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    message = error.get("msg", "invalid").removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
