"""POST /generate and /generate_stream, in S-LoRA's style (what the VTC artifact's benchmark client calls).

Body: {"inputs": text or token ids, "parameters": {"max_new_tokens", "do_sample", "temperature",
"top_p", "top_k", "ignore_eos"}, "lora_dir": the name of a served adapter (optional; never a path: an
unknown name is a 400, one the client may not use a 403, and nothing is loaded for either)}. The stream sends one event
per token, {"token": {"id", "text", "logprob", "special"}, "generated_text": null, "finished":
false, "details": null}, then a final event with the whole text and
details {"finish_reason", "prompt_tokens", "generated_tokens"}.
"""

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from slora_vtc.server.deps import Caller, CallerDep
from slora_vtc.server.generation import (
    EVENT_STREAM,
    Generation,
    new_request,
    prompt_ids,
    sampling,
    sse_response,
    streamed,
)
from slora_vtc.serving.errors import error_responses
from slora_vtc.serving.protocol import GenerateRequest
from slora_vtc.serving.sse import sse

router = APIRouter()
REFUSALS = error_responses(400, 401, 403, 413, 429, 503)


class EventStream(StreamingResponse):
    media_type = EVENT_STREAM  # what the schema says /generate_stream answers


@router.post("/generate", responses=REFUSALS)
async def generate(body: GenerateRequest, http: Request, who: CallerDep) -> dict:
    gen = await _start(who, body)
    text = await gen.collect(http)
    return {
        "generated_text": [text],
        "count_output_tokens": gen.end.generated,
        "finish_reason": gen.end.finish_reason,
        "prompt_tokens": gen.end.prompt_tokens,
    }


@router.post(
    "/generate_stream",
    response_class=EventStream,
    responses={200: streamed("one event per token, then the end")} | REFUSALS,
)
async def generate_stream(body: GenerateRequest, who: CallerDep):
    gen = await _start(who, body)
    return sse_response([gen], _events(gen))


async def _start(who: Caller, body: GenerateRequest) -> Generation:
    ctx, client = who.ctx, who.client()
    p = body.parameters
    params = sampling(p.temperature if p.do_sample else 0.0, p.top_p, p.top_k)
    ids = await asyncio.to_thread(prompt_ids, ctx, body.inputs)  # off the event loop
    return await Generation.start(
        ctx, new_request(ctx, client, ids, p.max_new_tokens, params, p.ignore_eos, body.lora_dir or client.adapter)
    )


async def _events(gen: Generation) -> AsyncIterator[str]:
    text = []
    async for delta in gen.deltas():
        text.append(delta.text)
        for i, token in enumerate(delta.ids):
            piece = delta.text if i == len(delta.ids) - 1 else ""
            yield sse(
                {
                    "token": {"id": token, "text": piece, "logprob": None, "special": False},
                    "generated_text": None,
                    "finished": False,
                    "details": None,
                }
            )
    end = gen.end
    details = {
        "finish_reason": end.finish_reason,
        "prompt_tokens": end.prompt_tokens,
        "generated_tokens": end.generated,
    }
    if end.finish_reason == "abort":
        details["error"] = end.reason
    yield sse({"token": None, "generated_text": "".join(text), "finished": True, "details": details})
