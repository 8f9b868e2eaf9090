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
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass

import httpx2
from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from slora_vtc.gateway.api import ApiKind, Routing, is_usage_only
from slora_vtc.gateway.assemble import Assembled, Unassembled
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.dispatcher import Ticket
from slora_vtc.gateway.upstream import Upstream
from slora_vtc.server.errors import ApiError

CLIENT_GONE = 499  # nginx's status for a client that closed the connection; nobody reads it


async def forward(ctx: GatewayContext, kind: ApiKind, body: dict, routing: Routing, client: str, http: HttpRequest) -> Response:
    as_stream = not routing.stream and kind.streams_whole(body)
    data = kind.upstream_body(body, routing, as_stream)
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
            events = _relay(ctx, kind, ticket, reply, drop_usage=kind.openai and not routing.client_wants_usage)
            # the background task settles a stream cancelled before its first chunk (the generator's finally never runs then)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                                     background=BackgroundTask(_settle_unsettled, ctx, ticket, reply))
        if as_stream:
            answer = await _unless_client_leaves(_assembled(ctx, kind, ticket, reply), http)
            if answer is None:
                ctx.dispatcher.abort(ticket)
                return Response(status_code=CLIENT_GONE)
            return answer
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
        raise ApiError(502, f"upstream {ticket.upstream.url} answered something that is not JSON", "server_error", "upstream_error") from None
    if usage is not None:
        ctx.dispatcher.reconcile(ticket, *usage)
    ctx.dispatcher.finish(ticket)
    return Response(content, media_type="application/json")


async def _unless_client_leaves(work: Coroutine, http: HttpRequest) -> Response | None:
    """What `work` returns (or raises), or None if the client disconnects first: `work` is then
    cancelled, and its own clean-up (closing the upstream's reply) has run when this returns."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    return None if task.cancelled() else task.result()


async def _assembled(ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response) -> Response:
    """A request that did not stream, sent as a stream: charged chunk by chunk, answered whole at
    its end. An error event, a stream cut short or a chunk that cannot be re-assembled is a 502
    (the request refunded); a broken connection raises httpx2's error (forward makes it a 502)."""
    progress, whole = _Progress(), Assembled(kind.chat)
    upstream = ticket.upstream
    try:
        async for _, event in _charged(ctx, kind, ticket, reply, progress):
            if isinstance(event, dict) and progress.broken is None:
                whole.add(event)
    except Unassembled as e:
        problem = f"answered a chunk the gateway cannot re-assemble ({e})"
    else:
        problem = None if progress.complete else _early_end(progress.broken)
    finally:
        await reply.aclose()
    if problem is not None:
        upstream.errors += 1
        ctx.dispatcher.fail(ticket)
        raise ApiError(502, f"upstream {upstream.url} {problem}", "server_error", "upstream_error")
    ctx.dispatcher.finish(ticket)
    return Response(json.dumps(whole.result()).encode(), media_type="application/json")


def _early_end(error_event: dict | None) -> str:
    if error_event is None:
        return "ended the answer early"
    error = error_event.get("error")
    message = error.get("message") if isinstance(error, dict) else error_event.get("message")
    return f"failed mid-answer ({message or 'no message'})"


@dataclass
class _Progress:
    """How far a stream got: its end seen without an error (`complete`), or the upstream's error event."""

    complete: bool = False
    broken: dict | None = None


DONE = "[DONE]"


async def _charged(ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response,
                   progress: _Progress) -> AsyncIterator[tuple[str, dict | str | None]]:
    """The upstream's SSE data lines with their events (a dict, DONE, or None for data that is not
    JSON), each event's tokens and usage charged before it is yielded."""
    dispatcher = ctx.dispatcher
    async for line in reply.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == DONE:
            progress.complete = progress.broken is None
            yield line, DONE
            continue
        try:
            event = json.loads(data)
        except ValueError:
            event = None
        if isinstance(event, dict):
            if kind.is_error(event):
                progress.broken = event
            elif tokens := kind.tokens_in(event):
                dispatcher.on_tokens(ticket, tokens)
            if progress.broken is None and (usage := kind.usage(event)) is not None:
                dispatcher.reconcile(ticket, *usage)
            progress.complete = progress.complete or (progress.broken is None and kind.ends(event))
        yield line, event


async def _relay(ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response, drop_usage: bool):
    """Pass the upstream's events on as they come, charging their tokens on the way."""
    settled, progress = False, _Progress()
    dispatcher = ctx.dispatcher
    try:
        async for line, event in _charged(ctx, kind, ticket, reply, progress):
            if event == DONE:
                yield "data: [DONE]\n\n"
            elif not (drop_usage and isinstance(event, dict) and is_usage_only(event)):
                yield f"{line}\n\n"
        settled = True
        if progress.complete:
            dispatcher.finish(ticket)
        else:
            ticket.upstream.errors += 1
            dispatcher.fail(ticket)
            if progress.broken is None:  # the upstream's own error event, if any, has gone out already
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
