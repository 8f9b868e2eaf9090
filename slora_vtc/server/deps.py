"""FastAPI dependencies: the server context, and who is calling (API key, X-Client-Id, `user`)."""

from dataclasses import dataclass

from fastapi import Request

from slora_vtc.server.context import ServerContext
from slora_vtc.serving.clients import BadClientName, ClientConfig, Unauthorized
from slora_vtc.serving.connection import CLIENT_HEADER, bearer_token
from slora_vtc.serving.errors import ApiError


def context(request: Request) -> ServerContext:
    return request.app.state.ctx


@dataclass(frozen=True)
class Caller:
    ctx: ServerContext
    keyed: ClientConfig | None  # the API key's client, when the clients file lists keys
    header: str | None  # X-Client-Id

    def client(self, user: str | None = None) -> ClientConfig:
        """The client to be fair to: the key's, else the header's, else the body's `user`."""
        if self.keyed is not None:
            return self.keyed
        try:
            return self.ctx.clients.identify(None, self.header, user)
        except BadClientName as e:
            raise ApiError(400, str(e)) from None


def caller(request: Request) -> Caller:
    """Refuses (401) a missing or unknown API key when the clients file lists keys."""
    ctx = context(request)
    keyed = None
    if ctx.clients.keys_required:
        try:
            keyed = ctx.clients.by_key(bearer_token(request.headers.get("authorization")))
        except Unauthorized as e:
            raise ApiError(401, str(e), "authentication_error") from None
    return Caller(ctx, keyed, request.headers.get(CLIENT_HEADER))
