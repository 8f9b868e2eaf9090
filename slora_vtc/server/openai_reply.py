"""OpenAI's response bodies and stream chunks for the generations of one request.

A request has one generation per (prompt, sequence), prompt-major: choice index = prompt index
* n + sequence, as OpenAI and vLLM number them. With best_of > n the n sequences of a prompt with
the highest cumulative logprob are returned, best first (vLLM's rule). A stream interleaves the
choices' chunks as their tokens come; each choice ends with its own finish_reason chunk.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from slora_vtc.server.context import ServerContext
from slora_vtc.server.generation import Delta, Generation, usage
from slora_vtc.server.logprobs import CompletionLogprobs, chat_logprobs, token_text
from slora_vtc.serving.protocol import ChatRequest, CompletionRequest
from slora_vtc.serving.sse import sse


def cumulative_logprob(gen: Generation) -> float:
    return sum(lp.logprob for lp in gen.logprobs)


def best(gens: list[Generation], per_prompt: int, n: int) -> list[Generation]:
    """The returned generations in choice order: of each prompt's `per_prompt`, the n most likely."""
    chosen = []
    for start in range(0, len(gens), per_prompt):
        group = gens[start : start + per_prompt]
        chosen.extend(sorted(group, key=cumulative_logprob, reverse=True)[:n] if per_prompt > n else group)
    return chosen


def request_usage(gens: list[Generation], per_prompt: int) -> dict:
    """Every generated sequence's tokens (best_of's unreturned ones too: they were served); each prompt once."""
    return usage(gens, sum(g.end.prompt_tokens for g in gens[::per_prompt]))


class CompletionChoices:
    """Choices of /v1/completions: text, the legacy logprobs object, echo of the prompt."""

    kind = "text_completion"

    def __init__(self, ctx: ServerContext, body: CompletionRequest, echoes: list[str] | None):
        self.k, self.echoes, self.per_prompt = body.logprobs, echoes, body.sequences
        self.text_of = token_text(ctx.tokenizer, body.return_tokens_as_token_ids)
        self._logprobs: dict[int, CompletionLogprobs] = {}

    def _lp(self, index: int, ids, logprobs) -> dict | None:
        if self.k is None or not ids:
            return None
        return self._logprobs.setdefault(index, CompletionLogprobs(self.text_of, self.k)).of(ids, logprobs)

    def _echo(self, index: int) -> str:
        return self.echoes[index // self.per_prompt] if self.echoes else ""

    def opening(self, index: int) -> dict | None:
        return self._choice(index, self._echo(index), None) if self.echoes else None

    def delta(self, index: int, delta: Delta) -> dict | None:
        if not delta.text and not delta.ids:
            return None
        return self._choice(index, delta.text, self._lp(index, delta.ids, delta.logprobs))

    def last(self, index: int, gen: Generation) -> dict:
        return self._choice(index, "", None, gen)

    def whole(self, index: int, gen: Generation, source: int) -> dict:
        return self._choice(index, self._echo(source) + gen.text, self._lp(index, gen.ids, gen.logprobs), gen)

    @staticmethod
    def _choice(index: int, text: str, logprobs: dict | None, gen: Generation | None = None) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, **_finish(gen)}


class ChatChoices:
    """Choices of /v1/chat/completions: the assistant's message, logprobs {"content": [...]}."""

    kind = "chat.completion"

    def __init__(self, ctx: ServerContext, body: ChatRequest):
        self.k, self.per_prompt = body.top_logprobs or 0, body.n
        self.with_logprobs = body.logprobs
        self.text_of = token_text(ctx.tokenizer, body.return_tokens_as_token_ids)

    def _lp(self, ids, logprobs) -> dict | None:
        return chat_logprobs(self.text_of, self.k, ids, logprobs) if self.with_logprobs and ids else None

    def opening(self, index: int) -> dict:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def delta(self, index: int, delta: Delta) -> dict | None:
        if not delta.text and not delta.ids:
            return None
        return {
            "index": index,
            "delta": {"content": delta.text},
            "logprobs": self._lp(delta.ids, delta.logprobs),
            "finish_reason": None,
        }

    def last(self, index: int, gen: Generation) -> dict:
        return {"index": index, "delta": {}, "logprobs": None, **_finish(gen)}

    def whole(self, index: int, gen: Generation, source: int) -> dict:
        return {
            "index": index,
            "message": {"role": "assistant", "content": gen.text},
            "logprobs": self._lp(gen.ids, gen.logprobs),
            **_finish(gen),
        }


def _finish(gen: Generation | None) -> dict:
    if gen is None:
        return {"finish_reason": None}
    return {"finish_reason": gen.finish_reason, "stop_reason": gen.stop_string}  # stop_reason: vLLM's extension


Choices = CompletionChoices | ChatChoices


class Reply:
    """The envelope shared by every response and chunk of one request."""

    def __init__(self, ctx: ServerContext, prefix: str, choices: Choices, include_usage: bool, adapter: str | None):
        """`model` names the LoRA adapter that served the request, else the base model's first name (as vLLM)."""
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.choices, self.model, self.created = choices, adapter or ctx.model_name, int(time.time())
        self.include_usage = include_usage

    def _envelope(self, kind: str, **fields) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, **fields}

    def whole(self, gens: list[Generation], n: int) -> dict:
        per_prompt = self.choices.per_prompt
        by_gen = {id(g): i for i, g in enumerate(gens)}
        chosen = [self.choices.whole(i, g, by_gen[id(g)]) for i, g in enumerate(best(gens, per_prompt, n))]
        return self._envelope(self.choices.kind, choices=chosen, usage=request_usage(gens, per_prompt))

    async def stream(self, gens: list[Generation]) -> AsyncIterator[str]:
        """Chunks as tokens come, each choice's finish reason as it ends, usage if asked for, [DONE].
        Opening chunks (chat: the assistant role; completions: the echoed prompt) go out at once. Every
        token the engine hands over gets its chunk, its text empty while the detokenizer or a stop
        string holds it back (as vLLM streams: a client counts tokens and times them by chunk)."""
        choices = self.choices
        kind = f"{choices.kind}.chunk" if choices.kind == "chat.completion" else choices.kind
        usage = {"usage": None} if self.include_usage else {}
        for i in range(len(gens)):
            if (opening := choices.opening(i)) is not None:
                yield sse(self._envelope(kind, choices=[opening], **usage))
        aborted = None
        async with aclosing(merged(gens)) as events:
            async for i, delta in events:
                choice = choices.last(i, gens[i]) if delta is None else choices.delta(i, delta)
                if delta is None and gens[i].finish_reason == "abort":
                    aborted = gens[i]
                    break
                if choice is not None:
                    yield sse(self._envelope(kind, choices=[choice], **usage))
        if aborted is not None:
            yield sse({"error": {"message": f"the request was aborted: {aborted.end.reason}", "type": "server_error"}})
        elif self.include_usage:
            yield sse(self._envelope(kind, choices=[], usage=request_usage(gens, choices.per_prompt)))
        yield sse("[DONE]")


async def merged(gens: list[Generation]) -> AsyncIterator[tuple[int, Delta | None]]:
    """(i, delta) as generation i produces one, (i, None) when it has ended; until all have."""
    if len(gens) == 1:
        async for delta in gens[0].deltas():
            yield 0, delta
        yield 0, None
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async for delta in gen.deltas():
                queue.put_nowait((i, delta))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(gens)
        while left:
            item = await queue.get()
            left -= item[1] is None
            yield item
    finally:
        for task in tasks:
            task.cancel()
