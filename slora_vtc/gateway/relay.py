"""Reading an upstream's stream: each event charged as it passes (`_charged`), then either relayed
to a client that streams (`relay`) or re-assembled into the whole answer of a client that does
not (`answer_whole`, assemble.py). Either way the request is settled once: finished at a complete
end, failed (refunded) at an error event, a stream cut short or a broken connection.
"""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx2
from fastapi.responses import Response

from slora_vtc.gateway.api import ApiKind, is_usage_only
from slora_vtc.gateway.assemble import Assembled, Unassembled
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.dispatcher import Ticket
from slora_vtc.serving.errors import ApiError

DONE = "[DONE]"


def failed(ctx: GatewayContext, ticket: Ticket, error: httpx2.HTTPError) -> ApiError:
    """Count the upstream's failure, refund the request, and say what happened. A connection that
    could not be made marks the upstream down first, so that the slot the refund frees goes to no
    waiting request while it is (a broken stream alone is not that)."""
    upstream = ticket.upstream
    if isinstance(error, httpx2.TimeoutException):
        upstream.timeouts += 1
        if isinstance(error, httpx2.ConnectTimeout):
            ctx.mark_down(upstream, certain=False)
        answer = ApiError(
            504, f"upstream {upstream.url} timed out ({type(error).__name__})", "server_error", "upstream_timeout"
        )
    else:
        upstream.errors += 1
        if isinstance(error, httpx2.ConnectError):
            ctx.mark_down(upstream)  # nothing listens: out of service until a probe answers
        answer = ApiError(
            502, f"upstream {upstream.url} failed ({type(error).__name__}: {error})", "server_error", "upstream_error"
        )
    ctx.dispatcher.fail(ticket)
    return answer


async def answer_whole(ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response) -> Response:
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


async def _charged(
    ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response, progress: _Progress
) -> AsyncIterator[tuple[str, dict | str | None]]:
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


async def relay(ctx: GatewayContext, kind: ApiKind, ticket: Ticket, reply: httpx2.Response, drop_usage: bool):
    """Pass the upstream's events on as they come, charging their tokens on the way."""
    settled, progress = False, _Progress()
    dispatcher = ctx.dispatcher
    try:
        async for line, event in _charged(ctx, kind, ticket, reply, progress):
            if event == DONE:
                yield "data: [DONE]\n\n"
            elif event is None:  # not JSON: half an event from an upstream that died mid-line; never relayed
                continue
            elif not (drop_usage and isinstance(event, dict) and is_usage_only(event)):
                yield f"{line}\n\n"
        settled = True
        if progress.complete:
            dispatcher.finish(ticket)
        else:
            ticket.upstream.errors += 1
            dispatcher.fail(ticket)
            if progress.broken is None:  # the upstream's own error event, if any, has gone out already
                error = ApiError(
                    502, f"upstream {ticket.upstream.url} ended the stream early", "server_error", "upstream_error"
                )
                for event in kind.error_event(error):
                    yield event
    except httpx2.HTTPError as e:
        settled = True
        for event in kind.error_event(failed(ctx, ticket, e)):
            yield event
    finally:
        if not settled:
            dispatcher.abort(ticket)  # the client went away (the generator was closed or cancelled)
        await reply.aclose()
