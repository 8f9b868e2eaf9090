"""Errors answered to HTTP clients, in OpenAI's shape: {"error": {"message", "type", ...}}, and the
exception handlers that answer them (the server's and the gateway's)."""

from collections.abc import Mapping
from types import MappingProxyType

from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse


class ApiError(Exception):
    """An HTTP error answer; `headers` go with it (Retry-After on a 429 or 503 refusal)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        headers: Mapping[str, str] = MappingProxyType({}),
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.headers = dict(headers)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error answer's body (OpenAI's shape); the OpenAPI schema names it for each error a route gives."""

    error: ErrorDetail


ERROR_MEANINGS = {
    400: "the body breaks a rule of its schema, or one between its fields the schema states in words",
    401: "a missing or unknown API key",
    403: "a LoRA adapter this client may not use",
    404: "a model this server does not serve",
    413: "a body larger than the server's limit",
    429: "the client is over its rate limit (Retry-After says when to come back)",
    503: "the server is overloaded or stopping, or the model failed (Retry-After when overloaded)",
}


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """A route's `responses=`: these errors, each with ErrorResponse's body."""
    return {status: {"model": ErrorResponse, "description": ERROR_MEANINGS[status]} for status in statuses}


def error_body(message: str, kind: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def validation_message(errors: list[dict]) -> str:
    """pydantic's errors as one readable line, one part per problem (as OpenAI answers)."""
    return "; ".join(_problem(e) for e in errors)


def _problem(error: dict) -> str:
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    message = error.get("msg", "invalid").removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


async def api_error_handler(request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.kind, exc.code), status_code=exc.status, headers=exc.headers)


async def http_error_handler(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404, 405: its Allow header kept) in OpenAI's shape too."""
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code, headers=exc.headers)
