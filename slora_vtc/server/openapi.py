"""The server's /openapi.json: FastAPI's schema of the routes and bodies, with the served model's numbers and names
put where serving/protocol.py marks them (token ids, new tokens, model and adapter names), and each route's
errors as it answers them (400 in OpenAI's shape where FastAPI would say 422)."""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from slora_vtc.server.context import ServerContext
from slora_vtc.server.generation import room
from slora_vtc.serving.protocol import ADAPTER_NAME, MODEL_NAME, NEW_TOKENS, TOKEN_ID

FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")  # the 422 body FastAPI documents; we answer 400


def install(app: FastAPI, ctx: ServerContext) -> None:
    """Serve `served_schema` at /openapi.json (built once, at the first request for it)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = served_schema(
                get_openapi(title=app.title, version=app.version, routes=app.routes), ctx
            )
        return app.openapi_schema

    app.openapi = openapi


def served_schema(schema: dict[str, Any], ctx: ServerContext) -> dict[str, Any]:
    for path in schema["paths"].values():
        for operation in path.values():
            operation["responses"].pop("422", None)
            for status, answer in operation["responses"].items():
                if int(status) >= 400:  # errors are JSON, whatever the route's 200 is (events, Prometheus text)
                    answer["content"] = {"application/json": {"schema": _only(answer.get("content"))}}
    for name in FASTAPI_VALIDATION:
        schema.get("components", {}).get("schemas", {}).pop(name, None)
    _fill(schema, fills(ctx))
    return schema


def _only(content: dict[str, Any] | None) -> dict[str, Any]:
    """The schema of an answer's (one) content, else any JSON object."""
    return next(iter(content.values()))["schema"] if content else {"type": "object"}


def fills(ctx: ServerContext) -> dict[str, dict[str, Any]]:
    """What each marker stands for on this server."""
    return {
        TOKEN_ID: {"maximum": ctx.spec.vocab_size - 1},
        NEW_TOKENS: {"maximum": room(ctx, 1, None)},  # the most a one-token prompt of the base model may ask
        MODEL_NAME: {"enum": [*ctx.base_model_aliases, *ctx.adapters.names]},
        ADAPTER_NAME: {"enum": list(ctx.adapters.names)},
    }


def _fill(node: Any, by_marker: dict[str, dict[str, Any]]) -> None:
    if isinstance(node, list):
        for item in node:
            _fill(item, by_marker)
    elif isinstance(node, dict):
        for marker, fill in by_marker.items():
            if node.pop(marker, False):
                if fill.get("enum") == []:  # nothing can be named: no value of this type is accepted
                    node.clear()
                    node["not"] = {}
                else:
                    node.update(fill)
        for value in node.values():
            _fill(value, by_marker)
