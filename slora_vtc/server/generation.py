"""One generation on the event-loop side: validated input -> Request -> events -> text.

A Generation submits its request, waits until the scheduler accepted or refused it (429 / 503
before any byte of the response is sent), then yields text deltas as tokens arrive. Whatever
way the response ends (done, client gone, task cancelled), `close` aborts a request that is
still live, so its pool slots are freed at once. A request whose text meets a stop string is
ended as finished instead (the engine ends it before its next step); its text is cut there, and
tokens the engine made after it are dropped. Several generations of one HTTP request (n > 1,
several prompts) start together and end together.
"""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from slora_vtc.memory import fits_alone
from slora_vtc.model.sampling_params import SamplingParams
from slora_vtc.request import Request, TokenLogprob
from slora_vtc.server.admission import check_adapter, refusal
from slora_vtc.server.context import ServerContext
from slora_vtc.server.events import Accepted, Ended, Subscriber, Tokens
from slora_vtc.server.service import ServiceStopped
from slora_vtc.server.stops import StopMatcher
from slora_vtc.server.tokenizer import IncrementalDecoder
from slora_vtc.serving.clients import ClientConfig
from slora_vtc.serving.connection import disconnected
from slora_vtc.serving.errors import ApiError

CLIENT_GONE = "client disconnected"


@dataclass(frozen=True)
class Delta:
    ids: tuple[int, ...]  # the tokens this delta adds (empty for the final flush)
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()  # one per id when the request asked for logprobs


# -- from input to a Request -----------------------------------------------------------------
def prompt_ids(ctx: ServerContext, prompt: str | list[int]) -> list[int]:
    ids = ctx.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise ApiError(400, "the prompt is empty: it needs at least one token")
    check_vocab(ctx, ids)
    return ids


def check_vocab(ctx: ServerContext, ids, field: str = "") -> None:
    """ApiError(400) naming the first id outside the model's vocabulary (and `field`, if given)."""
    vocab = ctx.spec.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        where = f"{field}: " if field else ""
        raise ApiError(400, f"{where}token id {bad} is outside the model's vocabulary (0..{vocab - 1})")


def room(ctx: ServerContext, prompt_len: int, adapter: str | None) -> int:
    """The most new tokens a prompt could be given: within the model's context and the pool alone."""
    cfg = ctx.engine_config
    pool = cfg.pool_tokens - cfg.slots_of(adapter)
    return min(ctx.spec.max_position - prompt_len, pool - 1 - prompt_len)


def sampling(temperature: float, top_p: float, top_k: int, **extra) -> SamplingParams:
    """Per-request sampling; `extra`: SamplingParams' seed, penalties and logprobs (kept when greedy)."""
    if temperature > 0:
        return SamplingParams(temperature, max(top_k, 0), top_p, **extra)
    return SamplingParams(**extra)


def new_request(
    ctx: ServerContext,
    client: ClientConfig,
    ids: list[int],
    max_tokens: int,
    params: SamplingParams,
    ignore_eos: bool,
    adapter: str | None,
    stop_ids: tuple[int, ...] = (),
) -> Request:
    """A Request that the engine can serve, or ApiError saying why it never could (400), or why this client may
    not have it (403: an adapter its clients-file entry does not allow).
    `stop_ids`: the client's own stop tokens, added to EOS (kept with ignore_eos, as vLLM does)."""
    n, context = len(ids), ctx.spec.max_position
    if adapter is not None:
        check_adapter(ctx, client, adapter)
    if n + max_tokens > context:
        raise ApiError(
            400,
            f"the prompt ({n} tokens) plus max_tokens ({max_tokens}) exceeds the model's context of {context} tokens",
        )
    eos = () if ignore_eos else ctx.spec.eos_token_ids
    req = Request(
        client.name,
        n,
        max_tokens,
        ctx.service.clock.now(),
        adapter=adapter,
        prompt_ids=ids,
        stop_tokens=tuple(dict.fromkeys((*eos, *stop_ids))),
        sampling=params,
    )
    if not fits_alone(req, ctx.engine_config):
        raise ApiError(400, _never_fits(ctx, req))
    return req


def _never_fits(ctx: ServerContext, req: Request) -> str:
    cfg = ctx.engine_config
    if req.prompt_len > cfg.batch_max_tokens:
        return (
            f"the prompt ({req.prompt_len} tokens) is longer than a prefill batch may be "
            f"({cfg.batch_max_tokens} tokens)"
        )
    adapter = f", {cfg.slots_of(req.adapter)} of them for the LoRA adapter" if req.adapter else ""
    most = cfg.pool_tokens - cfg.slots_of(req.adapter) - 1 - req.prompt_len
    if most < 1:
        return (
            f"the prompt ({req.prompt_len} tokens) is too long for the memory pool of {cfg.pool_tokens} tokens{adapter}"
        )
    return (
        f"the prompt ({req.prompt_len} tokens) plus max_tokens ({req.max_new_tokens}) can never fit the memory pool "
        f"of {cfg.pool_tokens} tokens{adapter}: at most {most} new tokens for this prompt"
    )


# -- the request's life on the loop ----------------------------------------------------------
class Generation:
    def __init__(self, ctx: ServerContext, request: Request):
        self.ctx = ctx
        self.request = request  # the engine thread's from submission on: read events, not its fields
        self._events: asyncio.Queue = asyncio.Queue()
        self._decoder = IncrementalDecoder(ctx.tokenizer)
        self._stops = StopMatcher()
        self._stop_ids = frozenset(request.stop_tokens)  # fixed at creation: safe to read here
        self.end: Ended | None = None
        self._closed = False
        self.ids: list[int] = []  # output tokens taken (up to the stop string, if one matched)
        self.text_parts: list[str] = []  # the text so far, as given out
        self.logprobs: list[TokenLogprob] = []  # those tokens' logprobs, when asked for

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

    def stop_on(self, stops: tuple[str, ...]) -> None:
        """End the generation at the first of these strings in its text (before reading it)."""
        self._stops = StopMatcher(stops)

    @property
    def stop_string(self) -> str | None:
        return self._stops.matched

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stop_string is not None else self.end.finish_reason

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Text as it is generated (each Tokens event), then any held-back remainder."""
        while self.end is None:
            event = await self._events.get()
            if isinstance(event, Tokens) and self.stop_string is None:
                delta = self._take(event)
                self.text_parts.append(delta.text)
                self.logprobs.extend(delta.logprobs)
                yield delta
            elif isinstance(event, Ended):
                self.end = event
        if self.stop_string is None:
            rest = self._stops.push(self._decoder.flush()) + self._stops.flush()
            if rest:
                self.text_parts.append(rest)
                yield Delta((), rest)

    def _take(self, event: Tokens) -> Delta:
        """The event's tokens up to a stop string, one by one (to know which token completed it).
        A stop token's own text is left out, as vLLM does."""
        if not self._stops.stops:  # one decode for the event; a stop token can only be its last id
            ids = event.ids
            self.ids.extend(ids)
            return Delta(ids, self._decoder.push(list(ids[:-1] if ids[-1] in self._stop_ids else ids)), event.logprobs)
        texts, taken = [], 0
        for token in event.ids:
            taken += 1
            piece = "" if token in self._stop_ids else self._decoder.push([token])
            texts.append(self._stops.push(piece))
            if self.stop_string is not None:
                self.ctx.service.finish(self.request)
                break
        self.ids.extend(event.ids[:taken])
        return Delta(event.ids[:taken], "".join(texts), event.logprobs[:taken])

    async def run(self) -> None:
        """Take every delta (the results land in text_parts and logprobs)."""
        async for _ in self.deltas():
            pass

    async def collect(self, http: HttpRequest) -> str:
        """The whole text (see `collect_all`)."""
        await collect_all([self], http)
        return self.text

    def close(self) -> None:
        """Abort the request if it is still live (idempotent); one ended by a stop string is
        left to end as finished."""
        if self.end is None and not self._closed and self.stop_string is None:
            self._closed = True
            self.ctx.service.abort(self.request, CLIENT_GONE)

    @property
    def completion_tokens(self) -> int:
        """Tokens generated; after a stop string: up to the token that completed it (as vLLM counts)."""
        return len(self.ids) if self.stop_string is not None else self.end.generated

    def usage(self) -> dict:
        return usage([self])


def usage(gens: list[Generation], prompt_tokens: int | None = None) -> dict:
    """OpenAI's usage of generations: completion tokens summed; `prompt_tokens` if given (several
    sequences of one prompt count it once), else the first generation's."""
    prompt = gens[0].end.prompt_tokens if prompt_tokens is None else prompt_tokens
    done = sum(g.completion_tokens for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


async def start_all(ctx: ServerContext, requests: list[Request], stops: tuple[str, ...] = ()) -> list[Generation]:
    """Start the generations together; if any is refused (or this task is cancelled), abort the others."""
    tasks = [asyncio.ensure_future(Generation.start(ctx, r)) for r in requests]
    try:
        await asyncio.wait(tasks)
    except asyncio.CancelledError:
        _close_started(tasks)
        raise
    failed = next((t.exception() for t in tasks if t.exception() is not None), None)
    if failed is not None:
        _close_started(tasks)
        raise failed
    gens = [t.result() for t in tasks]
    for gen in gens:
        gen.stop_on(stops)
    return gens


def _close_started(tasks: list[asyncio.Future]) -> None:
    for task in tasks:
        if not task.done():
            task.cancel()  # Generation.start aborts its request when cancelled while waiting
        elif not task.cancelled() and task.exception() is None:
            task.result().close()


async def collect_all(gens: list[Generation], http: HttpRequest) -> None:
    """Run the generations to their end. If the client goes away first: abort them all,
    ApiError(499); if the server aborted one (shutdown, model failure): ApiError(503)."""
    readers = asyncio.ensure_future(asyncio.gather(*(g.run() for g in gens)))
    watcher = asyncio.ensure_future(disconnected(http))
    try:
        done, _ = await asyncio.wait({readers, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if readers not in done:
            raise ApiError(499, CLIENT_GONE)
        readers.result()
    finally:
        readers.cancel()
        watcher.cancel()
        close_all(gens)
    aborted = next((g.end for g in gens if g.finish_reason == "abort"), None)
    if aborted is not None:
        raise ApiError(503, f"the request was aborted: {aborted.reason}", "service_unavailable")


def close_all(gens: list[Generation]) -> None:
    for gen in gens:
        gen.close()


# -- server-sent events ----------------------------------------------------------------------
EVENT_STREAM = "text/event-stream"


EVENT = {  # one server-sent event (OpenAPI before 3.2: an event stream's schema is its events')
    "type": "object",
    "properties": {"data": {"type": "string", "description": "a JSON object, or [DONE] at the end (OpenAI's)"}},
    "required": ["data"],
}


def streamed(description: str) -> dict:
    """A route's 200 answer as server-sent events (for its `responses=`)."""
    return {"description": description, "content": {EVENT_STREAM: {"schema": EVENT}}}


def sse_response(gens: list[Generation], events: AsyncIterator[str]) -> StreamingResponse:
    """Stream `events`; the requests are aborted however the stream ends early (the background task
    covers a stream cancelled before its first chunk, when the generator's finally never runs)."""

    async def guarded() -> AsyncIterator[str]:
        try:
            async for chunk in events:
                yield chunk
                await asyncio.sleep(0)  # let a lost connection be noticed before writing the next chunk
        finally:
            close_all(gens)

    return StreamingResponse(
        guarded(),
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-cache"},
        background=BackgroundTask(close_all, gens),
    )
