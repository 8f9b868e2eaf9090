"""FastAPI dependencies: the server context, and who is calling (API key, X-Client-Id, `user`)."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from slora_vtc.server.context import ServerContext
from slora_vtc.serving.clients import ClientConfig, Unauthorized
from slora_vtc.serving.connection import bearer_token, identify
from slora_vtc.serving.errors import ApiError


def context(request: Request) -> ServerContext:
    return request.app.state.ctx


@dataclass(frozen=True)
class Caller:
    ctx: ServerContext
    keyed: ClientConfig | None  # the API key's client, when the clients file lists keys
    headers: Mapping[str, str]

    def client(self, user: str | None = None) -> ClientConfig:
        """The client to be fair to: the key's, else the header's, else the body's `user`."""
        if self.keyed is not None:
            return self.keyed
        return identify(self.ctx.clients, self.headers, user)


def caller(request: Request) -> Caller:
    """Refuses (401) a missing or unknown API key when the clients file lists keys, before the body is read."""
    ctx = context(request)
    keyed = None
    if ctx.clients.keys_required:
        try:
            keyed = ctx.clients.by_key(bearer_token(request.headers.get("authorization")))
        except Unauthorized as e:
            raise ApiError(401, str(e), "authentication_error") from None
    return Caller(ctx, keyed, request.headers)


ContextDep = Annotated[ServerContext, Depends(context)]  # a route's `ctx: ContextDep`
CallerDep = Annotated[Caller, Depends(caller)]  # a route's `who: CallerDep`
