"""The HTTP server with the official `openai` client and S-LoRA's /generate: formats, usage,
streaming, bad input, client disconnects (tiny model on CPU, server on 127.0.0.1), with the engine
in the server's process and in one of its own (`--engine-process`)."""

import asyncio
import json
import time

import httpx2
import pytest
from openai import BadRequestError, OpenAI

from tests.helpers.server import running_server

POOL = 2000


@pytest.fixture(scope="module", params=[False, True], ids=["engine-thread", "engine-process"])
def server(request):
    """Every test here runs against both: the engine in a thread of the server, and in a process of its own."""
    with running_server(pool_tokens=POOL, scheduler="vtc", dummy_adapters=1, engine_process=request.param) as srv:
        yield srv


@pytest.fixture
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def text_prompt_tokens(text: str) -> int:
    return len(text.encode()) + 1  # the byte tokenizer: one id per UTF-8 byte, plus BOS


# -- OpenAI API --------------------------------------------------------------------------------
def test_completion_usage_and_text(client):
    r = client.completions.create(
        model="tiny", prompt="Hello, wörld", max_tokens=7, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.object == "text_completion" and r.model == "tiny"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == text_prompt_tokens("Hello, wörld")
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_streamed_text_equals_whole_text(client):
    kw = dict(model="tiny", prompt=[1, 40, 41, 42, 43], max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens == 5
    assert chunks[-2].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
    assert whole.usage.prompt_tokens == 5


def test_chat_and_chat_stream(client):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    r = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == text_prompt_tokens("system: be brief\nuser: hi\nassistant:")
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_completion_tokens=5,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content


def test_top_k_one_samples_the_greedy_tokens(client):
    """Per-request sampling reaches the backend: top_k = 1 at any temperature is greedy."""
    kw = dict(model="tiny", prompt=[1, 9, 8, 7], max_tokens=10, extra_body={"ignore_eos": True})
    greedy = client.completions.create(temperature=0, **kw).choices[0].text
    kw["extra_body"] = {"ignore_eos": True, "top_k": 1}
    assert client.completions.create(temperature=1.5, **kw).choices[0].text == greedy


@pytest.mark.parametrize("extreme", [{"top_p": 5e-324}, {"top_p": 1e-300}, {"top_p": 1e-46}, {"temperature": 5e-324}])
def test_a_denormal_top_p_or_temperature_samples_the_greedy_tokens(server, client, extreme):
    """top_p or temperature -> 0 keeps only the most likely token: the greedy output (5e-324 once got a 503)."""
    kw = dict(model="tiny", prompt=[1, 9, 8, 7], max_tokens=10)
    greedy = client.completions.create(temperature=0, extra_body={"ignore_eos": True}, **kw).choices[0].text
    body = {"temperature": 1.5, **extreme}
    assert client.completions.create(**kw, extra_body={"ignore_eos": True, **body}).choices[0].text == greedy
    generated = httpx2.post(
        f"{server.url}/generate",
        json={
            "inputs": [1, 9, 8, 7],
            "parameters": {"max_new_tokens": 10, "ignore_eos": True, "do_sample": True, **body},
        },
    )
    assert generated.status_code == 200 and generated.json()["generated_text"] == [greedy]


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list()] == ["tiny", "dummy-0"]  # the base model, then the adapters
    health = httpx2.get(f"{server.url}/health").json()
    assert health == {"status": "ok", "model": "tiny", "scheduler": "vtc", "pool_tokens": POOL}
    before = server.per_client("served_output_tokens").get("metrics-probe", 0)
    client.completions.create(
        model="tiny",
        prompt=[1, 2, 3],
        max_tokens=4,
        temperature=0,
        user="metrics-probe",
        extra_body={"ignore_eos": True},
    )
    m = server.wait_idle()
    assert m['slora_served_output_tokens_total{client="metrics-probe"}'] == before + 4
    assert m['slora_served_input_tokens_total{client="metrics-probe"}'] >= 3
    assert m['slora_client_counter{client="metrics-probe"}'] > 0  # VTC charged it
    assert m["slora_pool_tokens"] == POOL


# -- S-LoRA's API ------------------------------------------------------------------------------
def test_generate_and_generate_stream(server):
    body = {"inputs": [1, 5, 6], "parameters": {"max_new_tokens": 6, "ignore_eos": True}}
    whole = httpx2.post(f"{server.url}/generate", json=body).json()
    assert whole["count_output_tokens"] == 6 and len(whole["generated_text"]) == 1
    with httpx2.stream("POST", f"{server.url}/generate_stream", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    tokens, final = events[:-1], events[-1]
    assert len(tokens) == 6 and not any(e["finished"] for e in tokens)
    assert final["finished"] and final["details"] == {
        "finish_reason": "length",
        "prompt_tokens": 3,
        "generated_tokens": 6,
    }
    assert final["generated_text"] == whole["generated_text"][0]


def test_generate_text_input_with_client_header(server):
    r = httpx2.post(
        f"{server.url}/generate",
        json={"inputs": "abc", "parameters": {"max_new_tokens": 2, "ignore_eos": True}},
        headers={"X-Client-Id": "header-client"},
    )
    assert r.status_code == 200 and r.json()["prompt_tokens"] == 4
    assert server.per_client("requests_total", outcome="finished").get("header-client") == 1


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, expected",
    [
        ("{not json", "not valid JSON"),
        ('{"max_tokens": 3}', "prompt: Field required"),
        ('{"prompt": "x", "max_tokens": 0}', "max_tokens: Input should be greater than 0"),
        ('{"prompt": "x", "max_tokens": -5}', "max_tokens: Input should be greater than 0"),
        ('{"prompt": 12}', "prompt: must be a string or a list of token ids"),
        ('{"prompt": "x", "suffix": "y"}', "'suffix' is not supported"),
        ('{"prompt": "x", "logit_bias": {"5": 1}}', "'logit_bias' is not supported"),
        ('{"prompt": [1, 300]}', "token id 300 is outside the model's vocabulary"),
        ('{"prompt": []}', "the prompt is empty"),
        (
            '{"prompt": "x", "max_tokens": 1998}',
            "can never fit the memory pool of 2000 tokens: at most 1997 new tokens",
        ),
        ('{"prompt": "%s"}' % ("y" * 2500), "the prompt (2501 tokens) is too long for the memory pool of 2000 tokens"),
        (
            '{"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "max_tokens": 4090}',
            "exceeds the model's context of 4096 tokens",
        ),
        ('{"prompt": ["a", [[1]]]}', "prompt: must be a string or a list of token ids"),
        ('{"prompt": [[[1]]], "max_tokens": 4}', "prompt: must be a string or a list of token ids"),
        ('{"prompt": "\\ud800"}', "prompt: must be valid Unicode text (it holds a lone surrogate)"),
        ('{"prompt": "x", "max_tokens": "16"}', "max_tokens: Input should be a valid integer"),
        ('{"prompt": "x", "stream": "yes"}', "stream: Input should be a valid boolean"),
        (
            '{"prompt": "x", "stop_token_ids": [5000]}',
            "stop_token_ids: token id 5000 is outside the model's vocabulary",
        ),
        ('{"prompt": "x", "min_p": 0.1}', "'min_p' is not supported"),
        ('{"prompt": "x", "min_tokens": 3}', "'min_tokens' is not supported"),
        ('{"prompt": "x", "repetition_penalty": 0}', "repetition_penalty: Input should be greater than 0"),
        (
            '{"prompt": "x", "repetition_penalty": 1.0, "min_p": 0, "stop_token_ids": [], "max_tokens": 1, '
            '"ignore_eos": true}',
            None,
        ),
    ],
)
def test_bad_completion_requests_get_400_with_a_clear_message(server, body, expected):
    r = httpx2.post(f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    if expected is None:  # the "not used" values of refused fields are fine
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400
    assert expected in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"messages": []}, "messages: List should have at least 1 item"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ],
)
def test_bad_chat_requests(server, body, expected):
    r = httpx2.post(f"{server.url}/v1/chat/completions", json=body)
    assert r.status_code == 400 and expected in r.json()["error"]["message"]


def test_bad_generate_requests(server):
    for temperature in ("1e9", "Infinity"):
        body = '{"inputs": "x", "parameters": {"temperature": %s}}' % temperature
        r = httpx2.post(f"{server.url}/generate", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "temperature" in r.json()["error"]["message"], temperature
    r = httpx2.post(f"{server.url}/generate", json={"inputs": [[1]]})
    assert r.status_code == 400 and "must be a string or a list of token ids" in r.json()["error"]["message"]
    r = httpx2.post(f"{server.url}/generate", json={"parameters": {"max_new_tokens": 3}})
    assert r.status_code == 400 and "inputs: Field required" in r.json()["error"]["message"]
    r = httpx2.post(f"{server.url}/generate", json={"inputs": [1, 2], "parameters": {"max_new_tokens": 5000}})
    assert r.status_code == 400 and "exceeds the model's context" in r.json()["error"]["message"]


def test_openai_client_raises_on_a_bad_request_and_the_server_keeps_serving(server, client):
    with pytest.raises(BadRequestError, match="can never fit the memory pool"):
        client.completions.create(model="tiny", prompt=[1] * 1500, max_tokens=600)
    assert (
        client.completions.create(
            model="tiny", prompt="ok", max_tokens=2, extra_body={"ignore_eos": True}
        ).usage.completion_tokens
        == 2
    )
    server.wait_idle()


# -- disconnects ---------------------------------------------------------------------------------
def aborted(server, client_name: str) -> float:
    return server.per_client("requests_total", outcome="aborted").get(client_name, 0)


def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_disconnect_mid_stream_aborts_and_frees_the_pool(server):
    body = {"prompt": [1, 2, 3], "max_tokens": 1900, "stream": True, "ignore_eos": True, "user": "leaver"}
    with httpx2.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # a token arrived: it is running
        assert server.metrics()["slora_pool_used_tokens"] > 0
    wait_for(lambda: aborted(server, "leaver") == 1)
    m = server.wait_idle()
    assert m['slora_requests_total{client="leaver",outcome="finished"}'] == 0


def test_disconnect_while_queued_and_while_running(server):
    """A long request holds the pool; a second one waits; both clients leave (the waiter first); nothing is left."""

    async def scenario():
        async with httpx2.AsyncClient(timeout=30) as http:
            long = {"inputs": [1, 2, 3], "parameters": {"max_new_tokens": 1990, "ignore_eos": True}}
            async with http.stream(
                "POST", f"{server.url}/generate_stream", json=long, headers={"X-Client-Id": "hog"}
            ) as r1:
                lines = r1.aiter_lines()  # keep it: a collected iterator closes the response
                await anext(lines)
                queued = {"inputs": [1, 2], "parameters": {"max_new_tokens": 1000}}  # cannot run beside the hog
                async with http.stream(
                    "POST", f"{server.url}/generate_stream", json=queued, headers={"X-Client-Id": "waiter"}
                ) as r2:
                    assert r2.status_code == 200
                    wait = server.per_client("client_waiting")
                    assert wait.get("waiter") == 1
                # the waiter leaves first; had the hog's departure been noticed first, the waiter would be admitted
                # into the freed pool
                await asyncio.to_thread(wait_for, lambda: aborted(server, "waiter") == 1)

    asyncio.run(scenario())
    wait_for(lambda: aborted(server, "waiter") == 1 and aborted(server, "hog") == 1)
    m = server.wait_idle()
    assert m['slora_served_output_tokens_total{client="waiter"}'] == 0
    assert m['slora_served_output_tokens_total{client="hog"}'] > 0


def test_non_streaming_client_that_gives_up_is_aborted(server):
    # 1990 tokens take the tiny model over 0.6 s even alone on a fast CPU: the client leaves first
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.post(
            f"{server.url}/v1/completions",
            json={"prompt": [1, 2], "max_tokens": 1990, "ignore_eos": True, "user": "impatient"},
            timeout=httpx2.Timeout(0.2),
        )
    wait_for(lambda: aborted(server, "impatient") == 1)
    server.wait_idle()


def test_unknown_paths_and_methods_answer_in_openai_error_shape(server):
    r = httpx2.get(f"{server.url}/v1/nope")
    assert (
        r.status_code == 404
        and r.json()["error"]["type"] == "not_found_error"
        and r.json()["error"]["message"] == "Not Found"
    )
    r = httpx2.get(f"{server.url}/v1/completions")
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "POST" in r.headers["allow"]


def test_an_unknown_model_is_a_404_and_an_adapter_is_a_model(server, client):
    import openai

    with pytest.raises(openai.NotFoundError) as raised:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert raised.value.body["code"] == "model_not_found" and "dummy-0" in raised.value.body["message"]
    assert [m.id for m in client.models.list().data] == ["tiny", "dummy-0"]
    assert client.models.retrieve("dummy-0").id == "dummy-0"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    kw = dict(prompt=[1, 9, 8, 7], max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    base, lora, again = (client.completions.create(model=m, **kw) for m in ("tiny", "dummy-0", "tiny"))
    assert base.model == "tiny" and lora.usage.completion_tokens == 6
    assert lora.choices[0].text != base.choices[0].text == again.choices[0].text  # greedy: only the adapter changes it


def test_a_body_over_the_limit_is_a_413_declared_or_chunked():
    body = '{"prompt": "%s", "max_tokens": 1}' % ("z" * 2000)
    with running_server(pool_tokens=POOL, max_body_bytes=1000) as srv:
        url = f"{srv.url}/v1/completions"
        r = httpx2.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "limit of 1,000 bytes" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it arrives
            for i in range(0, len(body), 100):
                yield body[i : i + 100].encode()

        r = httpx2.post(url, content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        ok = httpx2.post(url, json={"prompt": "small", "max_tokens": 1, "ignore_eos": True})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


def test_tokenize_detokenize_and_version(server):
    r = httpx2.post(f"{server.url}/tokenize", json={"prompt": "héllo"})
    ids = r.json()["tokens"]
    assert r.status_code == 200 and r.json()["count"] == len(ids) == text_prompt_tokens("héllo")  # bytes + BOS
    assert r.json()["max_model_len"] == server.ctx.spec.max_position
    assert httpx2.post(f"{server.url}/detokenize", json={"tokens": ids[1:]}).json() == {"prompt": "héllo"}
    bad = httpx2.post(f"{server.url}/detokenize", json={"tokens": [1, 10**6]})
    assert bad.status_code == 400 and "outside the model's vocabulary" in bad.json()["error"]["message"]
    assert httpx2.post(f"{server.url}/tokenize", json={"prompt": 5}).status_code == 400
    from slora_vtc import __version__

    assert httpx2.get(f"{server.url}/version").json() == {"version": __version__}
