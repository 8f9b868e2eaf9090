"""schemathesis against `serve`'s own /openapi.json (the real tiny model on the CPU, on 127.0.0.1): for every
operation, bodies valid by the schema are served, or refused (400) only for a rule between fields that the
schema states in words, checked here by hand from those words; bodies the schema calls invalid are refused
with a 4xx; nothing answers a 5xx, and every answer (status, content type, body, each streamed event) is one
the schema documents. A bounded number of examples per operation and mode, from a fixed seed."""

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, example, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from slora_vtc.server.context import ServerContext
from tests.helpers.server import running_server

pytestmark = pytest.mark.slow

EXAMPLES = 25  # per operation and mode
POOL = 200  # tokens: small, so that the longest request a body may ask for takes a moment
OPERATIONS = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/generate"),
    ("POST", "/generate_stream"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/version"),
    ("GET", "/health"),
    ("GET", "/metrics"),
]
WITH_BODY = [op for op in OPERATIONS if op[0] == "POST"]
MAX_SEQUENCES = 64  # the schema's words: prompts x (best_of or n) in one request
COMPLETION_DEFAULT, CHAT_DEFAULT = 16, 256  # max_tokens when a body gives none (chat: at most this, within room)
# the sampling parameters' extremes the schema allows, tried first: the smallest positive double (5e-324 once made the
# model fail, a 503), the largest double, the largest 64-bit integer
TINY, HUGE, BIG = 5e-324, 1.7976931348623157e308, 2**63 - 1
EXTREMES = [
    {"top_p": TINY},
    {"temperature": TINY},
    {"temperature": TINY, "top_p": TINY, "top_k": BIG},
    {"temperature": 2, "top_p": 1e-300, "repetition_penalty": TINY},
    {"repetition_penalty": HUGE, "presence_penalty": -2, "frequency_penalty": 2},
    {"top_k": 1, "seed": 2**64 - 1, "repetition_penalty": 1e-300},
]
EXPLICIT = {
    "/v1/completions": [{"prompt": [1, 5, 9], "max_tokens": 5, "ignore_eos": True, **e} for e in EXTREMES]
    + [{"prompt": "hi", "n": 2, "max_tokens": 3, "stream": True, **EXTREMES[0]}],
    "/v1/chat/completions": [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **e} for e in EXTREMES],
    "/generate": [{"inputs": [1, 5], "parameters": {"do_sample": True, "top_p": TINY, "temperature": TINY}}],
    "/generate_stream": [{"inputs": "hi", "parameters": {"do_sample": True, "top_p": TINY, "max_new_tokens": 4}}],
}


@pytest.fixture(scope="module")
def served():
    with running_server(pool_tokens=POOL, dummy_adapters=1) as srv:
        yield srv, schemathesis.openapi.from_url(f"{srv.url}/openapi.json")


def test_the_schema_documents_every_route(served):
    _, schema = served
    assert sorted((op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()) == sorted(OPERATIONS)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
@pytest.mark.parametrize("method, path", OPERATIONS)
def test_bodies_are_accepted_or_refused_as_the_schema_says(served, method, path, mode):
    srv, schema = served
    if mode is GenerationMode.NEGATIVE and (method, path) not in WITH_BODY:
        pytest.skip("nothing to make invalid")  # /v1/models/{model_id} takes any string
    operation = next(
        op.ok() for op in schema.get_all_operations() if (op.ok().method.upper(), op.ok().path) == (method, path)
    )

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        response = case.call(base_url=srv.url, timeout=120)
        case.validate_response(response, excluded_checks=[positive_data_acceptance])
        if mode is GenerationMode.POSITIVE and response.status_code >= 400:
            if path == "/v1/models/{model_id}" and response.status_code == 404:
                return  # any string is a model id; one this server does not serve is the documented 404
            broken = stated_rule_broken(srv.ctx, path, case.body)
            assert response.status_code == 400 and broken is not None, (
                f"a body valid by the schema got {response.status_code}: {response.text[:300]} (body: {case.body!r})"
            )

    for body in EXPLICIT.get(path, []) if mode is GenerationMode.POSITIVE else []:
        check = example(case=operation.Case(body=body, media_type="application/json"))(check)
    check()


# -- the rules between fields the schema states in words, checked by hand ----------------------------------------
def stated_rule_broken(ctx: ServerContext, path: str, body: dict) -> str | None:
    """Which rule of the body's schema description a schema-valid body breaks (None: none)."""
    body = {k: v for k, v in body.items() if v is not None}  # null means not given
    if path == "/v1/completions":
        return completion_rule(ctx, body)
    if path == "/v1/chat/completions":
        if body.get("top_logprobs") and not body.get("logprobs"):
            return "top_logprobs without logprobs"
        prompt = prompt_tokens(ctx, ctx.tokenizer.chat_prompt(chat_turns(body["messages"])))
        adapter = adapter_of(ctx, body.get("model"))
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        new = int(asked) if asked else max(1, min(CHAT_DEFAULT, room(ctx, prompt, adapter)))
        return fit_rule(ctx, prompt, new, adapter)
    if path in ("/generate", "/generate_stream"):
        prompt = prompt_tokens(ctx, body["inputs"])
        new = int((body.get("parameters") or {}).get("max_new_tokens", 16))
        return fit_rule(ctx, prompt, new, body.get("lora_dir"))
    return None


def completion_rule(ctx: ServerContext, body: dict) -> str | None:
    n = int(body.get("n", 1))
    best_of = int(body["best_of"]) if "best_of" in body else None
    if best_of is not None and best_of < n:
        return "best_of below n"
    if body.get("stream") and best_of is not None and best_of > n:
        return "best_of above n, streamed"
    if body.get("echo") and "logprobs" in body:
        return "echo with logprobs"
    prompts = several(body["prompt"])
    if len(prompts) * (best_of or n) > MAX_SEQUENCES:
        return "too many sequences"
    new = int(body.get("max_tokens") or COMPLETION_DEFAULT)
    adapter = adapter_of(ctx, body.get("model"))
    return next((r for r in (fit_rule(ctx, prompt_tokens(ctx, p), new, adapter) for p in prompts) if r), None)


def several(prompt) -> list:
    """The prompts of a completions body: a list of strings or of id lists is several, anything else one."""
    return prompt if isinstance(prompt, list) and isinstance(prompt[0], str | list) else [prompt]


def prompt_tokens(ctx: ServerContext, prompt) -> int:
    return len(ctx.tokenizer.encode(prompt)) if isinstance(prompt, str) else len(prompt)


def chat_turns(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], content_text(m.get("content"))) for m in messages]


def content_text(content) -> str:
    return "".join(part["text"] for part in content) if isinstance(content, list) else content or ""


def adapter_of(ctx: ServerContext, model: str | None) -> str | None:
    return model if model in ctx.adapters else None


def room(ctx: ServerContext, prompt: int, adapter: str | None) -> int:
    """The most new tokens the model's context and the memory pool leave a prompt (with its adapter's slots)."""
    pool = ctx.engine_config.pool_tokens - ctx.engine_config.slots_of(adapter)
    return min(ctx.spec.max_position - prompt, pool - 1 - prompt)


def fit_rule(ctx: ServerContext, prompt: int, new: int, adapter: str | None) -> str | None:
    """ "the prompt's tokens plus max_tokens fit the model's context and the memory pool\""""
    if prompt > ctx.engine_config.batch_max_tokens:
        return "the prompt is longer than a prefill batch"
    return "does not fit" if new > room(ctx, prompt, adapter) else None
