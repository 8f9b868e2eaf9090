"""One generation on the event-loop side: validated input -> Request -> events -> text.

A Generation submits its request, waits until the scheduler accepted or refused it (429 / 503
before any byte of the response is sent), then yields text deltas as tokens arrive. Whatever
way the response ends (done, client gone, task cancelled), `close` aborts a request that is
still live, so its pool slots are freed at once.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from slora_vtc.memory import fits_alone
from slora_vtc.model.sampling import SamplingParams
from slora_vtc.request import Request
from slora_vtc.server.admission import check_adapter, refusal
from slora_vtc.server.clients import ClientConfig
from slora_vtc.server.context import ServerContext
from slora_vtc.server.errors import ApiError
from slora_vtc.server.service import Accepted, Ended, ServiceStopped, Subscriber, Tokens
from slora_vtc.server.tokenizer import IncrementalDecoder

CLIENT_GONE = "client disconnected"


@dataclass(frozen=True)
class Delta:
    ids: tuple[int, ...]  # the tokens this delta adds (empty for the final flush)
    text: str


# -- from input to a Request -----------------------------------------------------------------
def prompt_ids(ctx: ServerContext, prompt: str | list[int]) -> list[int]:
    ids = ctx.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise ApiError(400, "the prompt is empty: it needs at least one token")
    vocab = ctx.spec.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(400, f"token id {bad} is outside the model's vocabulary (0..{vocab - 1})")
    return ids


def room(ctx: ServerContext, prompt_len: int, adapter: str | None) -> int:
    """The most new tokens a prompt could be given: within the model's context and the pool alone."""
    cfg = ctx.engine_config
    pool = cfg.pool_tokens - cfg.slots_of(adapter)
    return min(ctx.spec.max_position - prompt_len, pool - 1 - prompt_len)


def sampling(temperature: float, top_p: float, top_k: int) -> SamplingParams:
    return SamplingParams(temperature, max(top_k, 0), top_p) if temperature > 0 else SamplingParams()


def new_request(ctx: ServerContext, client: ClientConfig, ids: list[int], max_tokens: int, params: SamplingParams,
                ignore_eos: bool, adapter: str | None) -> Request:
    """A Request that the engine can serve, or ApiError saying why it never could (400), or why this client may
    not have it (403: an adapter its clients-file entry does not allow)."""
    n, context = len(ids), ctx.spec.max_position
    if adapter is not None:
        check_adapter(ctx, client, adapter)
    if n + max_tokens > context:
        raise ApiError(400, f"the prompt ({n} tokens) plus max_tokens ({max_tokens}) exceeds the model's context of {context} tokens")
    req = Request(client.name, n, max_tokens, ctx.service.clock.now(), adapter=adapter, prompt_ids=ids,
                  stop_tokens=() if ignore_eos else ctx.spec.eos_token_ids, sampling=params)
    if not fits_alone(req, ctx.engine_config):
        raise ApiError(400, _never_fits(ctx, req))
    return req


def _never_fits(ctx: ServerContext, req: Request) -> str:
    cfg = ctx.engine_config
    if req.prompt_len > cfg.batch_max_tokens:
        return f"the prompt ({req.prompt_len} tokens) is longer than a prefill batch may be ({cfg.batch_max_tokens} tokens)"
    adapter = f", {cfg.slots_of(req.adapter)} of them for the LoRA adapter" if req.adapter else ""
    most = cfg.pool_tokens - cfg.slots_of(req.adapter) - 1 - req.prompt_len
    if most < 1:
        return f"the prompt ({req.prompt_len} tokens) is too long for the memory pool of {cfg.pool_tokens} tokens{adapter}"
    return (f"the prompt ({req.prompt_len} tokens) plus max_tokens ({req.max_new_tokens}) can never fit the memory pool "
            f"of {cfg.pool_tokens} tokens{adapter}: at most {most} new tokens for this prompt")


# -- the request's life on the loop ----------------------------------------------------------
class Generation:
    def __init__(self, ctx: ServerContext, request: Request):
        self.ctx = ctx
        self.request = request  # the engine thread's from submission on: read events, not its fields
        self._events: asyncio.Queue = asyncio.Queue()
        self._decoder = IncrementalDecoder(ctx.tokenizer)
        self.end: Ended | None = None
        self._closed = False

    @classmethod
    async def start(cls, ctx: ServerContext, request: Request) -> "Generation":
        gen = cls(ctx, request)
        try:
            ctx.service.submit(request, Subscriber(asyncio.get_running_loop(), gen._events))
        except ServiceStopped as e:
            raise ApiError(503, str(e), "service_unavailable") from None
        try:
            first = await gen._events.get()
        except asyncio.CancelledError:
            gen.close()
            raise
        if isinstance(first, Ended):
            gen.end = first
            raise refusal(ctx, request.client, first.reason)  # 429 or 503, with Retry-After
        assert isinstance(first, Accepted)
        return gen

    async def deltas(self) -> AsyncIterator[Delta]:
        """Text as it is generated (each Tokens event), then any held-back remainder."""
        while self.end is None:
            event = await self._events.get()
            if isinstance(event, Tokens):
                yield Delta(event.ids, self._decoder.push(list(event.ids)))
            elif isinstance(event, Ended):
                self.end = event
        rest = self._decoder.flush()
        if rest:
            yield Delta((), rest)

    async def collect(self, http: HttpRequest) -> str:
        """The whole text. If the client goes away first: abort, ApiError(499); if the server
        aborted the request (shutdown, model failure): ApiError(503)."""
        reader = asyncio.ensure_future(self._text())
        watcher = asyncio.ensure_future(_disconnected(http))
        try:
            done, _ = await asyncio.wait({reader, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
                raise ApiError(499, CLIENT_GONE)
        finally:
            reader.cancel()
            watcher.cancel()
            self.close()
        if self.end.finish_reason == "abort":
            raise ApiError(503, f"the request was aborted: {self.end.reason}", "service_unavailable")
        return reader.result()

    async def _text(self) -> str:
        return "".join([d.text async for d in self.deltas()])

    def close(self) -> None:
        """Abort the request if it is still live (idempotent)."""
        if self.end is None and not self._closed:
            self._closed = True
            self.ctx.service.abort(self.request, CLIENT_GONE)

    def usage(self) -> dict:
        end = self.end
        return {"prompt_tokens": end.prompt_tokens, "completion_tokens": end.generated,
                "total_tokens": end.prompt_tokens + end.generated}


async def _disconnected(http: HttpRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


# -- server-sent events ----------------------------------------------------------------------
# Line breaks JSON leaves raw but line-based SSE readers split on (Python's str.splitlines among them)
SSE_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"})


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False).translate(SSE_LINE_BREAKS)
    return f"data: {data}\n\n"


def sse_response(gen: Generation, events: AsyncIterator[str]) -> StreamingResponse:
    """Stream `events`; the request is aborted however the stream ends early (the background task
    covers a stream cancelled before its first chunk, when the generator's finally never runs)."""

    async def guarded() -> AsyncIterator[str]:
        try:
            async for chunk in events:
                yield chunk
                await asyncio.sleep(0)  # let a lost connection be noticed before writing the next chunk
        finally:
            gen.close()

    return StreamingResponse(guarded(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                             background=BackgroundTask(gen.close))
