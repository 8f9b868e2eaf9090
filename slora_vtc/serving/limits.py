"""A limit on request bodies, enforced before anything parses them: 413 in OpenAI's error shape.

A declared Content-Length above the limit is refused at once. A body without one (chunked) is
read here, chunk by chunk, and refused as soon as it passes the limit, so no more than the limit
is ever held; a body within it is handed on to the application whole.
"""

from fastapi.responses import JSONResponse

from slora_vtc.serving.errors import error_body


class BodyLimit:
    """ASGI middleware: request bodies of at most `limit` bytes."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(scope, receive, send)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later: a disconnect, which streaming responses watch for

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send):
        message = f"the request body is larger than this server's limit of {self.limit:,} bytes (--max-body-bytes)"
        await JSONResponse(error_body(message, "invalid_request_error"), status_code=413)(scope, receive, send)
