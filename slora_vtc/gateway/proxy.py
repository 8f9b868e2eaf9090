"""One request through the gateway: queue, wait for a slot, send upstream, relay and charge.

Every way a request can end settles it in the dispatcher exactly once: finished (the stream's
end, or the whole answer), failed (the upstream broke, timed out or refused it: refunded, an
OpenAI-shaped 502 / 504 or a final error event), or aborted (the client went away: charged for
what it was sent).
"""

import asyncio
import json

import httpx2
from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from slora_vtc.gateway.api import ApiKind, Routing, is_usage_only
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.dispatcher import Ticket
from slora_vtc.gateway.upstream import Upstream
from slora_vtc.server.errors import ApiError

CLIENT_GONE = 499  # nginx's status for a client that closed the connection; nobody reads it


async def forward(ctx: GatewayContext, kind: ApiKind, body: dict, routing: Routing, client: str, http: HttpRequest) -> Response:
    data = kind.upstream_body(body, routing)
    ticket = ctx.dispatcher.submit(client, routing.prompt_tokens, routing.max_tokens)
    if await _slot(ctx, ticket, http) is None:
        return Response(status_code=CLIENT_GONE)
    headers = ctx.upstream_headers(http.headers.get("authorization"), client)
    try:
        reply = await _send(ctx, ticket, kind.path, data, headers)
        if reply.status_code != 200:
            return await _refused(ctx, ticket, reply)
        if routing.stream:
            events = _relay(ctx, kind, ticket, reply, drop_usage=kind.openai and not routing.client_wants_usage)
            # the background task settles a stream cancelled before its first chunk (the generator's finally never runs then)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                                     background=BackgroundTask(_settle_unsettled, ctx, ticket, reply))
        return await _whole(ctx, kind, ticket, reply)
    except httpx2.HTTPError as e:
        raise _failed(ctx, ticket, e) from None
    except BaseException:
        ctx.dispatcher.abort(ticket)  # cancelled (the gateway is stopping); a no-op for a request already settled
        raise


async def _send(ctx: GatewayContext, ticket: Ticket, path: str, data: bytes, headers: dict[str, str]) -> httpx2.Response:
    """The upstream's answer (its headers). A connection that cannot be made sent nothing, so the
    request moves to another upstream with a free slot, while there is one."""
    while True:
        try:
            return await ctx.http.send(ctx.http.build_request("POST", ticket.upstream.url + path, content=data, headers=headers), stream=True)
        except httpx2.ConnectError:
            dead = ticket.upstream
            ctx.mark_down(dead)
            if not ctx.dispatcher.move(ticket):
                raise  # nowhere else to go: a 502 (_failed counts this last error)
            dead.errors += 1


async def _settle_unsettled(ctx: GatewayContext, ticket: Ticket, reply: httpx2.Response) -> None:
    ctx.dispatcher.abort(ticket)  # a no-op once the stream has settled it
    await reply.aclose()


async def _slot(ctx: GatewayContext, ticket: Ticket, http: HttpRequest) -> Upstream | None:
    """Wait until the dispatcher gives the request a slot; None if the client leaves first."""
    if not ticket.slot.done():
        watcher = asyncio.ensure_future(_disconnected(http))
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


async def _disconnected(http: HttpRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


def _failed(ctx: GatewayContext, ticket: Ticket, error: httpx2.HTTPError) -> ApiError:
    """Count the upstream's failure, refund the request, and say what happened."""
    upstream = ticket.upstream
    ctx.dispatcher.fail(ticket)
    if isinstance(error, httpx2.TimeoutException):
        upstream.timeouts += 1
        if isinstance(error, httpx2.ConnectTimeout):
            ctx.mark_down(upstream)
        return ApiError(504, f"upstream {upstream.url} timed out ({type(error).__name__})", "server_error", "upstream_timeout")
    upstream.errors += 1
    if isinstance(error, httpx2.ConnectError):
        ctx.mark_down(upstream)  # nothing listens: out of service until a probe answers (a broken stream alone is not that)
    return ApiError(502, f"upstream {upstream.url} failed ({type(error).__name__}: {error})", "server_error", "upstream_error")


async def _refused(ctx: GatewayContext, ticket: Ticket, reply: httpx2.Response) -> Response:
    """The upstream answered an error: a 4xx goes to the client as it is (the request is the
    client's problem, and nothing was served); a 5xx is the upstream's and becomes a 502."""
    try:
        content = await reply.aread()
    finally:
        await reply.aclose()
    upstream = ticket.upstream
    if reply.status_code < 500:
        ctx.dispatcher.fail(ticket, outcome="rejected")
        return Response(content, status_code=reply.status_code, media_type=reply.headers.get("content-type", "application/json"))
    upstream.errors += 1
    ctx.dispatcher.fail(ticket)
    raise ApiError(502, f"upstream {upstream.url} answered HTTP {reply.status_code} ({_message(content)})", "server_error", "upstream_error")


def _message(content: bytes) -> str:
    try:
        return str(json.loads(content)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        text = content.decode(errors="replace").strip()
        return text.splitlines()[0][:200] if text else "no message"


async def _whole(ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response) -> Response:
    """A request that does not stream is charged when its answer arrives, from its usage."""
    try:
        content = await reply.aread()
    finally:
        await reply.aclose()
    try:
        usage = kind.usage(json.loads(content))
    except (ValueError, AttributeError):
        ticket.upstream.errors += 1
        ctx.dispatcher.fail(ticket)
        raise ApiError(502, f"upstream {ticket.upstream.url} answered something that is not JSON", "server_error", "upstream_error") from None
    if usage is not None:
        ctx.dispatcher.reconcile(ticket, *usage)
    ctx.dispatcher.finish(ticket)
    return Response(content, media_type="application/json")


async def _relay(ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response, drop_usage: bool):
    """Pass the upstream's events on as they come, charging their tokens on the way."""
    settled, complete, broken = False, False, None
    dispatcher = ctx.dispatcher
    try:
        async for line in reply.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                complete = broken is None
                yield "data: [DONE]\n\n"
                continue
            try:
                event = json.loads(data)
            except ValueError:
                event = None
            if isinstance(event, dict):
                if kind.is_error(event):
                    broken = event
                elif tokens := kind.tokens_in(event):
                    dispatcher.on_tokens(ticket, tokens)
                if broken is None and (usage := kind.usage(event)) is not None:
                    dispatcher.reconcile(ticket, *usage)
                complete = complete or (broken is None and kind.ends(event))
                if drop_usage and is_usage_only(event):
                    continue
            yield f"{line}\n\n"
        settled = True
        if complete:
            dispatcher.finish(ticket)
        else:
            ticket.upstream.errors += 1
            dispatcher.fail(ticket)
            if broken is None:  # the upstream's own error event, if any, has gone out already
                error = ApiError(502, f"upstream {ticket.upstream.url} ended the stream early", "server_error", "upstream_error")
                for event in kind.error_event(error):
                    yield event
    except httpx2.HTTPError as e:
        settled = True
        for event in kind.error_event(_failed(ctx, ticket, e)):
            yield event
    finally:
        if not settled:
            dispatcher.abort(ticket)  # the client went away (the generator was closed or cancelled)
        await reply.aclose()
