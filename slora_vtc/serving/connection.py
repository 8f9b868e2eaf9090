"""What an HTTP request's connection says about its client, shared by the server and the gateway:
the API key it bears, the client it names, whether it has gone away."""

import hmac

from starlette.requests import Request

CLIENT_HEADER = "x-client-id"


def bearer_token(header: str | None) -> str | None:
    """The KEY of 'Authorization: Bearer KEY' (None without one)."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def bears_key(request: Request, key: str) -> bool:
    """Whether the request's bearer token is `key` (compared in constant time)."""
    return hmac.compare_digest((bearer_token(request.headers.get("authorization")) or "").encode(), key.encode())


async def disconnected(request: Request) -> None:
    """Returns once the client has closed the connection (the body must have been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
