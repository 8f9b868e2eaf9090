"""What an HTTP request's connection says about its client, shared by the server, the gateway and
the vLLM middleware: the API key it bears, the client it names, who it is from, whether it has gone
away."""

import hmac
from collections.abc import Mapping

from starlette.requests import Request

from slora_vtc.serving.clients import BadClientName, ClientConfig, Clients, Unauthorized
from slora_vtc.serving.errors import ApiError

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


def identify(clients: Clients, headers: Mapping[str, str], user: str | None) -> ClientConfig:
    """Who a request is from (serving/clients.py): with API keys the key's client, else the
    X-Client-Id header, else the body's `user`, else "anonymous". `headers`: lower-case names (as
    Starlette's Headers and ASGI give them). A missing or unknown key is a 401, a name too long a 400."""
    try:
        return clients.identify(bearer_token(headers.get("authorization")), headers.get(CLIENT_HEADER), user)
    except Unauthorized as e:
        raise ApiError(401, str(e), "authentication_error") from None
    except BadClientName as e:
        raise ApiError(400, str(e)) from None


async def disconnected(request: Request) -> None:
    """Returns once the client has closed the connection (the body must have been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
