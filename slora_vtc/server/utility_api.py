"""POST /tokenize, POST /detokenize and GET /version, in vLLM's shapes.

/tokenize answers the ids this server would feed the model for a prompt (its BOS included), with
their count and the model's context; /detokenize the text of ids of the model's vocabulary. A
`model` that this server does not serve is a 404, as on the completion routes (and vLLM's).
"""

import asyncio

from fastapi import APIRouter
from pydantic import BaseModel, field_validator

from slora_vtc import __version__
from slora_vtc.server.deps import ContextDep
from slora_vtc.server.generation import prompt_ids
from slora_vtc.server.openai_api import check_model
from slora_vtc.serving.errors import ApiError, error_responses
from slora_vtc.serving.protocol import STRICT, ModelName, TokenId, UnicodeText, is_token_ids, token_ids

router = APIRouter()


class TokenizeRequest(BaseModel):
    model_config = STRICT
    prompt: UnicodeText
    model: ModelName | None = None


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    tokens: list[TokenId]
    model: ModelName | None = None

    @field_validator("tokens", mode="before")
    @classmethod
    def _ids(cls, value):
        if not is_token_ids(value):
            raise ValueError("must be a list of token ids")
        return token_ids(value)


@router.post("/tokenize", responses=error_responses(400, 404, 413))
async def tokenize(body: TokenizeRequest, ctx: ContextDep) -> dict:
    check_model(ctx, body.model)
    ids = await asyncio.to_thread(prompt_ids, ctx, body.prompt)
    return {"count": len(ids), "max_model_len": ctx.spec.max_position, "tokens": ids}


@router.post("/detokenize", responses=error_responses(400, 404, 413))
async def detokenize(body: DetokenizeRequest, ctx: ContextDep) -> dict:
    check_model(ctx, body.model)
    vocab = ctx.spec.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(400, f"token id {bad} is outside the model's vocabulary (0..{vocab - 1})")
    return {"prompt": ctx.tokenizer.decode(body.tokens)}


@router.get("/version")
async def version() -> dict:
    return {"version": __version__}
