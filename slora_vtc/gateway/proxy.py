"""One request through the gateway: queue, wait for a slot, send upstream, relay and charge.

A request takes one of three paths:
- it streams: its chunks are relayed and charged as they pass;
- it does not stream, and its whole answer can be re-assembled from a stream (assemble.py: every
  completions and chat request but those with tools and a few other fields): it is sent as a
  stream, charged chunk by chunk as a stream is, and answered whole at its end;
- otherwise (and /generate) it is passed through as it is; completions and chat are charged their
  max_tokens at dispatch as a prediction, which the answer's usage replaces.

Every way a request can end settles it in the dispatcher exactly once: finished (the stream's
end, or the whole answer), failed (the upstream broke, timed out or refused it: refunded, an
OpenAI-shaped 502 / 504 or a final error event), or aborted (the client went away: charged for
what it was sent, or for what was produced until then).
"""

import asyncio
import json
from collections.abc import Coroutine

import httpx2
from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from slora_vtc.gateway.api import ApiKind, Routing, Tenant
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.dispatcher import Ticket
from slora_vtc.gateway.relay import answer_whole, failed, relay
from slora_vtc.gateway.upstream import Upstream
from slora_vtc.serving.connection import disconnected
from slora_vtc.serving.errors import ApiError

CLIENT_GONE = 499  # nginx's status for a client that closed the connection; nobody reads it
UNAVAILABLE = 503


async def forward(
    ctx: GatewayContext, kind: ApiKind, body: dict, routing: Routing, client: str, http: HttpRequest
) -> Response:
    as_stream = not routing.stream and kind.streams_whole(body)
    data = kind.upstream_body(body, routing, as_stream, Tenant(client, ctx.clients.keys_required))
    predicts = kind.openai and not routing.stream and not as_stream
    ticket = ctx.dispatcher.submit(client, routing.prompt_tokens, routing.max_tokens, predicts)
    if await _slot(ctx, ticket, http) is None:
        return Response(status_code=CLIENT_GONE)
    headers = ctx.upstream_headers(http.headers.get("authorization"), client)
    try:
        reply = await _send(ctx, ticket, kind.path, data, headers)
        if reply.status_code != 200:
            return await _refused(ctx, ticket, reply)
        if routing.stream:
            events = relay(ctx, kind, ticket, reply, drop_usage=kind.openai and not routing.client_wants_usage)
            # the background task settles a stream cancelled before its first chunk (the generator's finally
            # never runs then)
            return StreamingResponse(
                events,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
                background=BackgroundTask(_settle_unsettled, ctx, ticket, reply),
            )
        if as_stream:
            answer = await _unless_client_leaves(answer_whole(ctx, kind, ticket, reply), http)
            if answer is None:
                ctx.dispatcher.abort(ticket)
                return Response(status_code=CLIENT_GONE)
            return answer
        return await _whole(ctx, kind, ticket, reply)
    except httpx2.HTTPError as e:
        raise failed(ctx, ticket, e) from None
    except BaseException:
        ctx.dispatcher.abort(ticket)  # cancelled (the gateway is stopping); a no-op for a request already settled
        raise


async def _send(
    ctx: GatewayContext, ticket: Ticket, path: str, data: bytes, headers: dict[str, str]
) -> httpx2.Response:
    """The upstream's answer (its headers). A connection that cannot be made (refused, or not made
    within the connect timeout) sent nothing, so the request moves to another upstream with a free
    slot, while there is one."""
    while True:
        try:
            return await ctx.http.send(
                ctx.http.build_request("POST", ticket.upstream.url + path, content=data, headers=headers), stream=True
            )
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as e:
            unreachable, refused = ticket.upstream, isinstance(e, httpx2.ConnectError)
            ctx.mark_down(unreachable, certain=refused)
            if not ctx.dispatcher.move(ticket):
                raise  # nowhere else to go: a 502 or 504 (failed counts this last error)
            if refused:
                unreachable.errors += 1
            else:
                unreachable.timeouts += 1


async def _settle_unsettled(ctx: GatewayContext, ticket: Ticket, reply: httpx2.Response) -> None:
    ctx.dispatcher.abort(ticket)  # a no-op once the stream has settled it
    await reply.aclose()


async def _slot(ctx: GatewayContext, ticket: Ticket, http: HttpRequest) -> Upstream | None:
    """Wait until the dispatcher gives the request a slot; None if the client leaves first."""
    if not ticket.slot.done():
        watcher = asyncio.ensure_future(disconnected(http))
        try:
            await asyncio.wait((ticket.slot, watcher), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            ctx.dispatcher.abort(ticket)
            raise
        finally:
            watcher.cancel()
        if not ticket.slot.done():
            ctx.dispatcher.abort(ticket)
            return None
    return ticket.slot.result()  # raises what ended it while waiting (no upstream left)


async def _refused(ctx: GatewayContext, ticket: Ticket, reply: httpx2.Response) -> Response:
    """The upstream answered an error: a 4xx goes to the client as it is (the request is the
    client's problem, and nothing was served); a 5xx is the upstream's and becomes a 502. A 503
    says the upstream takes no requests now (it is stopping, or full): it is sent nothing until a
    probe finds /health answering, or it would fail every request the queue sends it, at once."""
    try:
        content = await reply.aread()
    finally:
        await reply.aclose()
    upstream = ticket.upstream
    if reply.status_code < 500:
        ctx.dispatcher.fail(ticket, outcome="rejected")
        return Response(
            content, status_code=reply.status_code, media_type=reply.headers.get("content-type", "application/json")
        )
    upstream.errors += 1
    if reply.status_code == UNAVAILABLE:
        ctx.mark_down(upstream, certain=False)
    ctx.dispatcher.fail(ticket)
    raise ApiError(
        502,
        f"upstream {upstream.url} answered HTTP {reply.status_code} ({_message(content)})",
        "server_error",
        "upstream_error",
    )


def _message(content: bytes) -> str:
    try:
        return str(json.loads(content)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        text = content.decode(errors="replace").strip()
        return text.splitlines()[0][:200] if text else "no message"


async def _whole(ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response) -> Response:
    """A request passed through whole: its usage replaces the prediction it was charged at dispatch."""
    try:
        content = await reply.aread()
    finally:
        await reply.aclose()
    try:
        usage = kind.usage(json.loads(content))
    except (ValueError, AttributeError):
        ticket.upstream.errors += 1
        ctx.dispatcher.fail(ticket)
        raise ApiError(
            502, f"upstream {ticket.upstream.url} answered something that is not JSON", "server_error", "upstream_error"
        ) from None
    if usage is not None:
        ctx.dispatcher.reconcile(ticket, *usage)
    ctx.dispatcher.finish(ticket)
    return Response(content, media_type="application/json")


async def _unless_client_leaves(work: Coroutine, http: HttpRequest) -> Response | None:
    """What `work` returns (or raises), or None if the client disconnects first: `work` is then
    cancelled, and its own clean-up (closing the upstream's reply) has run when this returns."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected(http))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    return None if task.cancelled() else task.result()
