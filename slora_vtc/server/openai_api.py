"""POST /v1/completions and /v1/chat/completions (OpenAI's formats, streaming or not), GET /v1/models.

`model` names the base model (the client's own adapter, if its clients-file entry has one) or a
served LoRA adapter, which then serves the request (as vLLM's --lora-modules); any other name is
a 404. As vLLM's, the base model answers to each of its --served-model-name names: /v1/models lists
them all, then the adapters, and responses say the first.
Completions take several prompts, n and best_of, echo and logprobs; both take stop strings and
stop_token_ids, seed, and presence / frequency / repetition penalties (openai_reply.py numbers
the choices).
"""

import asyncio

from fastapi import APIRouter, Request

from slora_vtc.model.sampling_params import SamplingParams
from slora_vtc.server.context import ServerContext
from slora_vtc.server.deps import CallerDep, ContextDep
from slora_vtc.server.generation import (
    Generation,
    check_vocab,
    collect_all,
    new_request,
    prompt_ids,
    room,
    sampling,
    sse_response,
    start_all,
    streamed,
)
from slora_vtc.server.openai_reply import ChatChoices, CompletionChoices, Reply
from slora_vtc.serving.clients import ClientConfig
from slora_vtc.serving.errors import ApiError, error_responses
from slora_vtc.serving.protocol import (
    CHAT_DEFAULT_MAX_TOKENS,
    COMPLETION_DEFAULT_MAX_TOKENS,
    ChatRequest,
    CompletionRequest,
    OpenAIParams,
)

router = APIRouter()
GENERATION_ANSWERS = {
    200: streamed('the whole answer as JSON, or with "stream": true, its chunks as server-sent events'),
    **error_responses(400, 401, 403, 404, 413, 429, 503),
}


@router.get("/v1/models")
async def models(ctx: ContextDep) -> dict:
    return {"object": "list", "data": [_model_card(ctx, name) for name in _served(ctx)]}


@router.get("/v1/models/{model_id:path}", responses=error_responses(404))
async def model(model_id: str, ctx: ContextDep) -> dict:
    check_model(ctx, model_id)
    return _model_card(ctx, model_id if model_id in ctx.model_names or model_id in ctx.adapters else ctx.model_name)


def _served(ctx: ServerContext) -> list[str]:
    return [*ctx.model_names, *ctx.adapters.names]


def _model_card(ctx: ServerContext, name: str) -> dict:
    card = {"id": name, "object": "model", "created": 0, "owned_by": "slora_vtc"}
    if name in ctx.adapters:
        card.update(parent=ctx.model_name, root=name)
    return card


def check_model(ctx: ServerContext, name: str | None) -> None:
    """ApiError(404) unless `name` is None, one of the base model's names or a served adapter's."""
    if name is not None and name not in ctx.base_model_aliases and name not in ctx.adapters:
        raise ApiError(
            404,
            f"the model '{name}' does not exist (served: {', '.join(_served(ctx))})",
            "not_found_error",
            "model_not_found",
        )


def _adapter(ctx: ServerContext, body: OpenAIParams, client: ClientConfig) -> str | None:
    """The adapter named as the model, else the client's own."""
    check_model(ctx, body.model)
    return body.model if body.model in ctx.adapters else client.adapter


@router.post("/v1/completions", responses=GENERATION_ANSWERS)
async def completions(body: CompletionRequest, http: Request, who: CallerDep):
    ctx, client = who.ctx, who.client(body.user)
    adapter = _adapter(ctx, body, client)
    prompts = body.prompts
    ids = await asyncio.to_thread(
        lambda: [prompt_ids(ctx, p) for p in prompts]
    )  # off the event loop: a long prompt must not stall streams
    gens = await _start(ctx, client, body, ids, body.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS, adapter)
    echoes = [p if isinstance(p, str) else ctx.tokenizer.decode(i) for p, i in zip(prompts, ids)] if body.echo else None
    reply = Reply(ctx, "cmpl", CompletionChoices(ctx, body, echoes), body.include_usage, adapter)
    if body.stream:
        return sse_response(gens, reply.stream(gens))
    await collect_all(gens, http)
    return reply.whole(gens, body.n)


@router.post("/v1/chat/completions", responses=GENERATION_ANSWERS)
async def chat(body: ChatRequest, http: Request, who: CallerDep):
    ctx, client = who.ctx, who.client(body.user)
    adapter = _adapter(ctx, body, client)
    ids = await asyncio.to_thread(
        lambda: prompt_ids(ctx, ctx.tokenizer.chat_prompt([(m.role, m.text) for m in body.messages]))
    )
    max_tokens = (
        body.max_completion_tokens
        or body.max_tokens
        or max(1, min(CHAT_DEFAULT_MAX_TOKENS, room(ctx, len(ids), adapter)))
    )
    gens = await _start(ctx, client, body, [ids], max_tokens, adapter)
    reply = Reply(ctx, "chatcmpl", ChatChoices(ctx, body), body.include_usage, adapter)
    if body.stream:
        return sse_response(gens, reply.stream(gens))
    await collect_all(gens, http)
    return reply.whole(gens, body.n)


async def _start(
    ctx: ServerContext,
    client: ClientConfig,
    body: OpenAIParams,
    prompts: list[list[int]],
    max_tokens: int,
    adapter: str | None,
) -> list[Generation]:
    """One generation per prompt and sequence, prompt-major, started together."""
    stop_ids = _stop_ids(ctx, body)
    requests = [
        new_request(ctx, client, ids, max_tokens, _sampling(body, j), body.ignore_eos, adapter, stop_ids)
        for ids in prompts
        for j in range(body.sequences)
    ]
    return await start_all(ctx, requests, body.stop_strings)


def _sampling(body: OpenAIParams, sequence: int) -> SamplingParams:
    return sampling(
        body.temperature,
        body.top_p,
        body.top_k,
        seed=body.seed_of(sequence),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logprobs=body.engine_logprobs(),
    )


def _stop_ids(ctx: ServerContext, body: OpenAIParams) -> tuple[int, ...]:
    check_vocab(ctx, body.stop_token_ids or (), "stop_token_ids")
    return tuple(body.stop_token_ids or ())
