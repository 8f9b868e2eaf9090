"""`serve`'s /openapi.json states the served model's numbers and names (worked out by hand for the tiny model:
vocabulary 256, context 4096) and every error as the server answers it (test_openapi_fuzz.py checks it against
the server's answers)."""

import pytest
from pydantic import ValidationError

from slora_vtc.server.app import create_app
from slora_vtc.server.context import ServerConfig, build_context
from slora_vtc.serving.protocol import CompletionRequest, GenerateParameters

POOL = 300


def openapi(**settings) -> dict:
    return create_app(build_context(ServerConfig(pool_tokens=POOL, **settings))).openapi()


@pytest.fixture(scope="module")
def schema():
    return openapi(served_model_names=("a", "b"), dummy_adapters=1)


def body(schema: dict, name: str) -> dict:
    return schema["components"]["schemas"][name]["properties"]


def branches(prop: dict) -> list[dict]:
    return prop.get("anyOf", [prop])


def test_token_ids_are_the_vocabulary_s(schema):
    ids = {"minimum": 0, "maximum": 255, "type": "integer"}
    prompt = branches(body(schema, "CompletionRequest")["prompt"])
    assert prompt[1] == {"items": ids, "minItems": 1, "type": "array"}  # one prompt of ids: at least one
    assert prompt[3]["items"]["items"] == ids and prompt[3]["minItems"] == prompt[3]["items"]["minItems"] == 1
    assert branches(body(schema, "GenerateRequest")["inputs"])[1]["items"] == ids
    assert body(schema, "DetokenizeRequest")["tokens"]["items"] == ids
    assert branches(body(schema, "ChatRequest")["stop_token_ids"])[0]["items"] == ids


def test_new_tokens_are_at_most_what_a_one_token_prompt_could_get(schema):
    most = min(4096 - 1, POOL - 1 - 1)  # the context less the prompt; the pool less the prompt, less one
    for name, field in [
        ("CompletionRequest", "max_tokens"),
        ("ChatRequest", "max_tokens"),
        ("ChatRequest", "max_completion_tokens"),
        ("GenerateParameters", "max_new_tokens"),
    ]:
        ints = next(b for b in branches(body(schema, name)[field]) if b.get("type") == "integer")
        assert ints["maximum"] == most and ints["exclusiveMinimum"] == 0, (name, field)


def test_names_are_the_served_ones(schema):
    assert branches(body(schema, "CompletionRequest")["model"])[0]["enum"] == ["a", "b", "dummy-0"]
    assert branches(body(schema, "TokenizeRequest")["model"])[0]["enum"] == ["a", "b", "dummy-0"]
    assert branches(body(schema, "GenerateRequest")["lora_dir"])[0]["enum"] == ["dummy-0"]
    without_adapters = openapi()
    assert branches(body(without_adapters, "GenerateRequest")["lora_dir"])[0] == {"not": {}}
    assert branches(body(without_adapters, "ChatRequest")["model"])[0]["enum"] == ["tiny"]


def test_fields_rules_and_refused_fields(schema):
    completion = body(schema, "CompletionRequest")
    assert branches(completion["stop"])[1]["maxItems"] == 4
    assert completion["suffix"]["anyOf"] == [{"const": ""}, {"type": "null"}]
    assert completion["min_p"]["anyOf"] == [{"const": 0}, {"type": "null"}]
    assert {"type": "null"} in completion["n"]["anyOf"]  # null means not given
    assert body(schema, "ChatRequest")["echo"]["anyOf"] == [{"const": False}, {"type": "null"}]
    assert "best_of is at least n" in schema["components"]["schemas"]["CompletionRequest"]["description"]


def test_every_error_is_documented_in_openai_s_shape_and_no_422(schema):
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    expected = {
        ("post", "/v1/completions"): {"400", "401", "403", "404", "413", "429", "503"},
        ("post", "/generate_stream"): {"400", "401", "403", "413", "429", "503"},
        ("post", "/tokenize"): {"400", "404", "413"},
        ("get", "/v1/models/{model_id}"): {"404"},
        ("get", "/metrics"): {"401"},
    }
    for (method, path), statuses in expected.items():
        answers = schema["paths"][path][method]["responses"]
        assert set(answers) - {"200"} == statuses
        assert all(answers[s]["content"] == error for s in statuses)
    assert not any("422" in op["responses"] for path in schema["paths"].values() for op in path.values())
    assert set(schema["paths"]["/generate_stream"]["post"]["responses"]["200"]["content"]) == {"text/event-stream"}
    assert set(schema["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]) == {
        "application/json",
        "text/event-stream",
    }


def test_a_number_with_no_fraction_is_an_integer_and_nothing_else_is():
    """JSON Schema (and vLLM) count 16.0 as an integer; a string, a bool or 2.5 is none."""
    r = CompletionRequest(prompt=[1.0, 2], n=2.0, max_tokens=16.0, seed=-3.0)
    assert (r.prompts, r.n, r.max_tokens, r.seed) == ([[1, 2]], 2, 16, -3)
    assert type(r.n) is int and all(type(t) is int for t in r.prompts[0])
    assert GenerateParameters(max_new_tokens=8.0).max_new_tokens == 8
    for bad in (dict(n="2"), dict(n=2.5), dict(max_tokens=True), dict(prompt=[1.5]), dict(prompt=[True])):
        with pytest.raises(ValidationError):
            CompletionRequest(**{"prompt": "x", **bad})
