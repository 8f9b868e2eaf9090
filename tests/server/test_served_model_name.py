"""`serve --served-model-name`, as vLLM's: the base model answers to every name given, /v1/models lists
them (then the adapters), responses say the first (or the LoRA adapter that served them), and any other
name (the model's own included) is the usual 404."""

import httpx2
import pytest
from openai import NotFoundError, OpenAI

from slora_vtc.cli import build_parser
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.server import running_server

NAMES = ("llama-tiny", "meta-llama/Llama-3.2-1B")  # a second name of vLLM's usual shape (with a slash)
KW = dict(prompt=[1, 9, 8, 7], max_tokens=4, temperature=0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def server():
    with running_server(pool_tokens=1000, served_model_names=NAMES, dummy_adapters=1) as srv:
        yield srv


@pytest.fixture
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_every_name_is_listed_then_the_adapters(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [*NAMES, "dummy-0"]
    assert models[2].parent == NAMES[0]  # an adapter's parent is the first name, as vLLM's
    assert client.models.retrieve(NAMES[1]).id == NAMES[1]
    assert httpx2.get(f"{server.url}/health").json()["model"] == NAMES[0]


@pytest.mark.parametrize("name", NAMES)
def test_every_name_is_served_and_responses_say_the_first(server, client, name):
    whole = client.completions.create(model=name, **KW)
    assert whole.model == NAMES[0] and whole.usage.completion_tokens == 4
    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.model == NAMES[0]
    chunks = list(client.completions.create(model=name, stream=True, **KW))
    assert {c.model for c in chunks} == {NAMES[0]}
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    body = {"prompt": KW["prompt"], "max_tokens": 4, "temperature": 0, "ignore_eos": True}  # no model: the base
    unnamed = httpx2.post(f"{server.url}/v1/completions", json=body)
    assert unnamed.json()["model"] == NAMES[0] and unnamed.json()["choices"][0]["text"] == whole.choices[0].text


def test_a_response_names_the_lora_adapter_that_served_it(client):
    """vLLM's responses name the LoRA adapter a request was served by, not the base model."""
    whole = client.completions.create(model="dummy-0", **KW)
    chat = client.chat.completions.create(model="dummy-0", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    chunks = list(client.completions.create(model="dummy-0", stream=True, **KW))
    assert (whole.model, chat.model, {c.model for c in chunks}) == ("dummy-0", "dummy-0", {"dummy-0"})


@pytest.mark.parametrize("name", ["tiny", "gpt-4"])
def test_any_other_name_is_the_usual_404(server, client, name):
    """The model's own name is no longer one of its names (vLLM answers it with a 404 too)."""
    with pytest.raises(NotFoundError) as raised:
        client.completions.create(model=name, **KW)
    assert raised.value.body["code"] == "model_not_found" and raised.value.body["type"] == "not_found_error"
    assert f"'{name}'" in raised.value.body["message"] and NAMES[1] in raised.value.body["message"]
    with pytest.raises(NotFoundError):
        client.models.retrieve(name)
    r = httpx2.post(f"{server.url}/tokenize", json={"prompt": "hi", "model": name})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx2.post(f"{server.url}/tokenize", json={"prompt": "hi", "model": NAMES[1]}).status_code == 200


def test_the_flag_takes_several_names_and_repeats():
    parse = build_parser().parse_args
    assert parse(["serve", "--served-model-name", "a", "b", "--served-model-name", "c"]).served_model_name == [
        "a",
        "b",
        "c",
    ]
    assert parse(["serve"]).served_model_name == []


@pytest.mark.parametrize(
    "argv, parts",
    [
        (["--served-model-name", " "], ["--served-model-name", "empty"]),
        (["--dummy-adapters", "1", "--served-model-name", "x", "dummy-0"], ["dummy-0", "LoRA adapter"]),
    ],
)
def test_bad_names_are_one_line_and_status_2(capsys, argv, parts):
    code, _, err = run_cli(capsys, "serve", "--port", "0", *argv)
    assert_one_line_error(code, err, *parts)
