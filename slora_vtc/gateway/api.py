"""The request kinds the gateway relays: what it reads from a body, and from each streamed chunk.

The gateway reads only what it needs to schedule and charge (stream, max_tokens, n, user, an
estimate of the prompt's length); every other field goes to the upstream untouched (a request
that does not stream gets `stream` and `stream_options` when assemble.py can answer it whole from
the stream). A streamed
chunk carries one token per choice with text (vLLM and our `serve` send a chunk per token; a
token that completes no character sends none, which `usage` then makes up).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from slora_vtc.gateway.assemble import assembles
from slora_vtc.gateway.charges import estimate_tokens
from slora_vtc.serving.errors import ApiError, error_body, validation_message
from slora_vtc.serving.protocol import (
    CHAT_DEFAULT_MAX_TOKENS,
    COMPLETION_DEFAULT_MAX_TOKENS,
    GenerateParameters,
    Int,
)
from slora_vtc.serving.sse import sse


class _OpenAIFields(BaseModel):
    """The fields the gateway itself reads, checked strictly (the rest is the upstream's business)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    stream: bool = False
    max_tokens: Int(gt=0) | None = None  # 16.0 is 16, as serve and vLLM take it
    max_completion_tokens: Int(gt=0) | None = None
    n: Int(gt=0) | None = None
    user: str | None = None
    stream_options: dict | None = None


class _GenerateFields(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    inputs: str | list[int]
    parameters: GenerateParameters = GenerateParameters()


@dataclass(frozen=True)
class Routing:
    """What the gateway needs to know of one request."""

    stream: bool
    prompt_tokens: int  # an estimate for text, exact for token ids
    max_tokens: int
    user: str | None
    client_wants_usage: bool


def _checked(model: type[BaseModel], body: dict) -> BaseModel:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise ApiError(400, validation_message(e.errors())) from None


def _prompt_tokens(prompt) -> tuple[int, int]:
    """(estimated tokens, number of prompts) of a completions prompt in any of its forms."""
    if isinstance(prompt, str):
        return estimate_tokens(prompt), 1
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return sum(_prompt_tokens(p)[0] for p in prompt), len(prompt)
    if isinstance(prompt, list):
        return max(1, len(prompt)), 1
    return 1, 1  # a malformed prompt: the upstream answers the 400


def _message_tokens(messages) -> int:
    if not isinstance(messages, list):
        return 1
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "".join(
                part.get("text", "") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
        total += estimate_tokens(content) if isinstance(content, str) else 1
    return max(1, total)


# -- the tenant, for the upstream -------------------------------------------------------------
XARGS = "vllm_xargs"  # vLLM's extra sampling arguments: they reach its engine, and our plugin reads the tenant there
TENANT_KEY = "tenant"


@dataclass(frozen=True)
class Tenant:
    name: str  # the client the gateway identified
    authenticated: bool  # by its API key: it replaces a tenant the body names


def with_tenant(body: dict, tenant: Tenant) -> dict:
    """The body with `vllm_xargs.tenant` naming the client, so that vLLM running our plugin charges
    the same tenant the gateway does (vLLM drops headers and `user` before its engine). A tenant the
    body names already is kept, unless the gateway authenticated the client by its key; a
    `vllm_xargs` that is not an object is left as it is (the upstream refuses it)."""
    xargs = body.get(XARGS)
    if xargs is None:
        xargs = {}
    if not isinstance(xargs, dict) or (TENANT_KEY in xargs and not tenant.authenticated):
        return body
    return {**body, XARGS: {**xargs, TENANT_KEY: tenant.name}}


# -- the kinds ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ApiKind:
    name: str
    path: str  # on the upstream
    route: Callable[[dict], Routing]
    tokens_in: Callable[[dict], int]  # tokens one streamed event carries
    usage: Callable[[dict], tuple[int | None, int | None] | None]  # from a streamed event or a whole answer
    ends: Callable[[dict], bool]  # the last event of a complete stream (OpenAI: [DONE] instead)
    is_error: Callable[[dict], bool]
    error_event: Callable[[ApiError], list[str]]  # the events that end a stream the upstream broke
    openai: bool = True
    chat: bool = False
    streams_whole: Callable[[dict], bool] = lambda body: (
        False
    )  # a request that does not stream may be sent as a stream (assemble.py)

    def upstream_body(
        self, body: dict, routing: Routing, as_stream: bool = False, tenant: Tenant | None = None
    ) -> bytes:
        """The body to send: the client's, with usage asked for when it streams (to reconcile);
        `as_stream`: a request that does not stream, sent as a stream with usage; `tenant`: who it
        is from, for a fair scheduler inside the upstream (OpenAI's kinds: `with_tenant`)."""
        if tenant is not None and self.openai:
            body = with_tenant(body, tenant)
        if as_stream:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        elif self.openai and routing.stream and not routing.client_wants_usage:
            body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
        return json.dumps(body).encode()


def _openai_usage(event: dict) -> tuple[int | None, int | None] | None:
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return None
    return usage.get("prompt_tokens"), usage.get("completion_tokens")


def _openai_error(error: ApiError) -> list[str]:
    return [sse(error_body(error.message, error.kind, error.code)), sse("[DONE]")]


def _openai_routing(body: dict, chat: bool) -> Routing:
    fields = _checked(_OpenAIFields, body)
    if chat:
        prompt, prompts = _message_tokens(body.get("messages")), 1
        max_tokens = fields.max_completion_tokens or fields.max_tokens or CHAT_DEFAULT_MAX_TOKENS
    else:
        prompt, prompts = _prompt_tokens(body.get("prompt"))
        max_tokens = fields.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS
    wants_usage = bool((fields.stream_options or {}).get("include_usage"))
    return Routing(fields.stream, prompt, max_tokens * prompts * (fields.n or 1), fields.user, wants_usage)


def _choices_with(key: Callable[[dict], object]) -> Callable[[dict], int]:
    def count(event: dict) -> int:
        choices = event.get("choices")
        return sum(1 for c in choices if isinstance(c, dict) and key(c)) if isinstance(choices, list) else 0

    return count


def _chat_delta(choice: dict) -> object:
    delta = choice.get("delta")
    return isinstance(delta, dict) and (
        delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
    )


def _has_error(event: dict) -> bool:
    return "error" in event or event.get("object") == "error"  # the latter: older vLLM's error events


COMPLETIONS = ApiKind(
    "completions",
    "/v1/completions",
    lambda b: _openai_routing(b, chat=False),
    _choices_with(lambda c: c.get("text")),
    _openai_usage,
    lambda e: False,
    _has_error,
    _openai_error,
    streams_whole=lambda b: assembles(b, chat=False),
)
CHAT = ApiKind(
    "chat",
    "/v1/chat/completions",
    lambda b: _openai_routing(b, chat=True),
    _choices_with(_chat_delta),
    _openai_usage,
    lambda e: False,
    _has_error,
    _openai_error,
    chat=True,
    streams_whole=lambda b: assembles(b, chat=True),
)


# S-LoRA's /generate and /generate_stream (what bench-http sends): one event per token, then a final one
def _generate_routing(body: dict, stream: bool) -> Routing:
    fields = _checked(_GenerateFields, body)
    prompt = estimate_tokens(fields.inputs) if isinstance(fields.inputs, str) else max(1, len(fields.inputs))
    return Routing(stream, prompt, fields.parameters.max_new_tokens, None, False)


def _generate_usage(event: dict) -> tuple[int | None, int | None] | None:
    details = event.get("details")
    if isinstance(details, dict):
        return details.get("prompt_tokens"), details.get("generated_tokens")
    if "count_output_tokens" in event:
        return event.get("prompt_tokens"), event.get("count_output_tokens")
    return None


def _generate_aborted(event: dict) -> bool:
    details = event.get("details")
    return isinstance(details, dict) and details.get("finish_reason") == "abort"


def _generate_error(error: ApiError) -> list[str]:
    return [
        sse(
            {
                "token": None,
                "generated_text": None,
                "finished": True,
                "details": {"finish_reason": "abort", "error": error.message},
            }
        )
    ]


GENERATE = ApiKind(
    "generate",
    "/generate",
    lambda b: _generate_routing(b, stream=False),
    lambda e: 0,
    _generate_usage,
    lambda e: False,
    _generate_aborted,
    _generate_error,
    openai=False,
)
GENERATE_STREAM = ApiKind(
    "generate_stream",
    "/generate_stream",
    lambda b: _generate_routing(b, stream=True),
    lambda e: 1 if e.get("token") else 0,
    _generate_usage,
    lambda e: e.get("finished") is True,
    _generate_aborted,
    _generate_error,
    openai=False,
)


def is_usage_only(event: dict) -> bool:
    """The chunk that only carries usage (choices empty): dropped when the client did not ask for it."""
    return event.get("choices") == [] and isinstance(event.get("usage"), dict)
