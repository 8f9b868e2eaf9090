"""POST /v1/completions and /v1/chat/completions (OpenAI's formats, streaming or not), GET /v1/models.

`model` names the base model (the client's own adapter, if its clients-file entry has one) or a
served LoRA adapter, which then serves the request (as vLLM's --lora-modules); any other name is
a 404.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request

from slora_vtc.server.clients import ClientConfig
from slora_vtc.server.context import ServerContext
from slora_vtc.server.deps import Caller, caller, context
from slora_vtc.server.errors import ApiError
from slora_vtc.server.generation import Generation, new_request, prompt_ids, room, sampling, sse, sse_response
from slora_vtc.server.protocol import ChatRequest, CompletionRequest, OpenAIParams

router = APIRouter()

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for completions
CHAT_DEFAULT_MAX_TOKENS = 256  # chat has no default upstream (up to the context); cap what one request reserves


@router.get("/v1/models")
async def models(ctx: ServerContext = Depends(context)) -> dict:
    return {"object": "list", "data": [_model_card(ctx, name) for name in _served(ctx)]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, ctx: ServerContext = Depends(context)) -> dict:
    _check_model(ctx, model_id)
    return _model_card(ctx, model_id if model_id in ctx.adapters else ctx.model_name)


def _served(ctx: ServerContext) -> list[str]:
    return [ctx.model_name, *ctx.adapters.names]


def _model_card(ctx: ServerContext, name: str) -> dict:
    card = {"id": name, "object": "model", "created": 0, "owned_by": "slora_vtc"}
    if name != ctx.model_name:
        card.update(parent=ctx.model_name, root=name)
    return card


def _check_model(ctx: ServerContext, name: str | None) -> None:
    if name is not None and name not in (ctx.model_name, ctx.config.model) and name not in ctx.adapters:
        raise ApiError(404, f"the model '{name}' does not exist (served: {', '.join(_served(ctx))})", "not_found_error", "model_not_found")


def _adapter(ctx: ServerContext, body: OpenAIParams, client: ClientConfig) -> str | None:
    """The adapter named as the model, else the client's own."""
    _check_model(ctx, body.model)
    return body.model if body.model in ctx.adapters else client.adapter


@router.post("/v1/completions")
async def completions(body: CompletionRequest, http: Request, who: Caller = Depends(caller)):
    ctx, client = who.ctx, who.client(body.user)
    _check_model(ctx, body.model)
    ids = await asyncio.to_thread(prompt_ids, ctx, body.prompt)  # off the event loop: a long prompt must not stall streams
    gen = await _start(ctx, client, body, ids, body.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS)
    reply = _Reply(ctx, "cmpl", "text_completion", body.include_usage)
    if body.stream:
        return sse_response(gen, reply.stream(gen, _text_choice))
    text = await gen.collect(http)
    return reply.whole(gen, _text_choice(text, gen.end.finish_reason))


@router.post("/v1/chat/completions")
async def chat(body: ChatRequest, http: Request, who: Caller = Depends(caller)):
    ctx, client = who.ctx, who.client(body.user)
    _check_model(ctx, body.model)
    ids = await asyncio.to_thread(lambda: prompt_ids(ctx, ctx.tokenizer.chat_prompt([(m.role, m.text) for m in body.messages])))
    max_tokens = body.max_completion_tokens or body.max_tokens or max(1, min(CHAT_DEFAULT_MAX_TOKENS, room(ctx, len(ids), _adapter(ctx, body, client))))
    gen = await _start(ctx, client, body, ids, max_tokens)
    reply = _Reply(ctx, "chatcmpl", "chat.completion", body.include_usage)
    if body.stream:
        return sse_response(gen, reply.stream(gen, _delta_choice, opening={"role": "assistant", "content": ""}))
    text = await gen.collect(http)
    message = {"role": "assistant", "content": text}
    return reply.whole(gen, {"index": 0, "message": message, "logprobs": None, "finish_reason": gen.end.finish_reason})


async def _start(ctx: ServerContext, client: ClientConfig, body: OpenAIParams, ids: list[int], max_tokens: int) -> Generation:
    params = sampling(body.temperature, body.top_p, body.top_k)
    return await Generation.start(ctx, new_request(ctx, client, ids, max_tokens, params, body.ignore_eos, _adapter(ctx, body, client)))


def _text_choice(text: str, finish: str | None) -> dict:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


def _delta_choice(text: str, finish: str | None, delta: dict | None = None) -> dict:
    return {"index": 0, "delta": delta if delta is not None else ({"content": text} if text else {}),
            "logprobs": None, "finish_reason": finish}


class _Reply:
    """The envelope shared by every response and chunk of one request."""

    def __init__(self, ctx: ServerContext, prefix: str, kind: str, include_usage: bool):
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kind, self.model, self.created = kind, ctx.model_name, int(time.time())
        self.include_usage = include_usage

    def _envelope(self, kind: str, **fields) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, **fields}

    def whole(self, gen: Generation, choice: dict) -> dict:
        return self._envelope(self.kind, choices=[choice], usage=gen.usage())

    async def stream(self, gen: Generation, choice, opening: dict | None = None) -> AsyncIterator[str]:
        """Chunks as tokens come: text deltas, the finish reason, usage if asked for, [DONE].

        `opening` (chat: the assistant role) is sent at once, before the first token."""
        kind = f"{self.kind}.chunk" if self.kind == "chat.completion" else self.kind
        usage = {"usage": None} if self.include_usage else {}
        if opening is not None:
            yield sse(self._envelope(kind, choices=[choice("", None, opening)], **usage))
        async for delta in gen.deltas():
            if delta.text:
                yield sse(self._envelope(kind, choices=[choice(delta.text, None)], **usage))
        end = gen.end
        if end.finish_reason == "abort":
            yield sse({"error": {"message": f"the request was aborted: {end.reason}", "type": "server_error"}})
        else:
            yield sse(self._envelope(kind, choices=[choice("", end.finish_reason)], **usage))
            if self.include_usage:
                yield sse(self._envelope(kind, choices=[], usage=gen.usage()))
        yield sse("[DONE]")
