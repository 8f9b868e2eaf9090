"""Errors answered to HTTP clients, in OpenAI's shape: {"error": {"message", "type", ...}}."""

from collections.abc import Mapping
from types import MappingProxyType


class ApiError(Exception):
    """An HTTP error answer; `headers` go with it (Retry-After on a 429 or 503 refusal)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 headers: Mapping[str, str] = MappingProxyType({})):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.headers = dict(headers)


def error_body(message: str, kind: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
