"""TenantMiddleware: names each request's tenant in vLLM's API server, as `slora-vtc serve` does,
and passes it to the engine in the body's `vllm_xargs.tenant` (vLLM drops headers and `user`
before the engine; `vllm_xargs` becomes the engine request's `sampling_params.extra_args`).

The tenant: the clients file's API key (when it gives keys), else the X-Client-Id header, else the
body's `user`, else "anonymous" (`serving.connection.identify`). A body that already carries
`vllm_xargs.tenant` keeps it; one that is not a string is refused with vLLM's 400 error. The clients
file is the one the plugin's additional config names ("clients"), read on the first request.

ASGI only: bodies of POST requests with a JSON object are read whole, rewritten and replayed; any
other request passes untouched (vLLM answers it as without the middleware).
"""

import json

from slora_vtc.errors import UserError
from slora_vtc.serving.clients import Clients
from slora_vtc.serving.connection import identify
from slora_vtc.serving.errors import ApiError
from slora_vtc.vllm.config import PluginConfig
from slora_vtc.vllm.tenant import TENANT_KEY

XARGS = "vllm_xargs"
KINDS = {400: "BadRequestError", 401: "Unauthorized", 403: "Forbidden"}


class TenantMiddleware:
    def __init__(self, app):
        self.app = app
        self._clients: Clients | None = None

    def clients(self, scope) -> Clients:
        if self._clients is None:
            state = getattr(scope.get("app"), "state", None)
            vllm_config = getattr(state, "vllm_config", None)
            additional = getattr(vllm_config, "additional_config", None)
            self._clients = PluginConfig.of(additional if isinstance(additional, dict) else None).load_clients()
        return self._clients

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body, more = await read_body(receive)
        if body is None:  # the client left while sending
            return
        try:
            rewritten = self.rewrite(scope, body)
        except ApiError as e:
            return await answer_error(send, e.status, e.message)
        except UserError as e:
            return await answer_error(send, 500, str(e))
        if rewritten is not body:
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(rewritten)).encode())]}
        await self.app(scope, replay(rewritten, receive), send)

    def rewrite(self, scope, body: bytes) -> bytes:
        """The body with the tenant in vllm_xargs (the same bytes when there is nothing to write)."""
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return body
        if not isinstance(data, dict):
            return body
        xargs = data.get(XARGS)
        if isinstance(xargs, dict) and TENANT_KEY in xargs:
            if not isinstance(xargs[TENANT_KEY], str) or not xargs[TENANT_KEY]:
                raise ApiError(400, f"{XARGS}.{TENANT_KEY} must be a non-empty string, got {xargs[TENANT_KEY]!r}")
            return body
        if xargs is not None and not isinstance(xargs, dict):
            return body  # vLLM refuses it
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        user = data.get("user") if isinstance(data.get("user"), str) else None
        tenant = identify(self.clients(scope), headers, user).name
        data[XARGS] = {**(xargs or {}), TENANT_KEY: tenant}
        return json.dumps(data).encode()


async def read_body(receive) -> tuple[bytes | None, bool]:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def replay(body: bytes, receive):
    sent = False

    async def receive_again():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later: a disconnect, which vLLM watches for to abort

    return receive_again


async def answer_error(send, status: int, message: str) -> None:
    """vLLM's error shape: {"error": {"message", "type", "param", "code"}}."""
    kind = KINDS.get(status, "InternalServerError")
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
