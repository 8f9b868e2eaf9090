"""The gateway in front of two of our own `serve` upstreams (tiny model, 127.0.0.1), and of a fake
upstream whose timing the test controls: the OpenAI formats through the official client, bodies
passed on untouched, charging while a stream runs, bad input, client disconnects, bench-http."""

import asyncio
import json

import httpx2
import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from slora_vtc.cli import main
from slora_vtc.results import read_results
from tests.helpers.gateway import FakeUpstream, fake_upstream, gateway, upstream, wait_for

POOL = 2000


@pytest.fixture(scope="module")
def upstreams():
    with upstream(pool_tokens=POOL) as first, upstream(pool_tokens=POOL) as second:
        yield first, second


@pytest.fixture(scope="module")
def gw(upstreams):
    with gateway(*(u.url for u in upstreams), scheduler="vtc", max_inflight=2) as g:
        yield g


def openai_client(url: str, client: str = "alice") -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, default_headers={"X-Client-Id": client})


def test_completions_and_chat_through_the_gateway_equal_the_upstream_s_own(gw, upstreams):
    direct, through = openai_client(upstreams[0].url), openai_client(gw.url)
    args = dict(model="tiny", prompt="Hello, gateway", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    a, b = direct.completions.create(**args), through.completions.create(**args)
    assert b.choices[0].text == a.choices[0].text and b.usage == a.usage
    messages = [{"role": "user", "content": "Hi"}]
    whole = through.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    chunks = list(
        through.chat.completions.create(
            model="tiny", messages=messages, max_tokens=5, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert whole.usage.completion_tokens == 5
    assert gw.wait_idle()['slora_gateway_client_service{client="alice"}'] > 0


def test_the_usage_chunk_reaches_only_clients_that_ask_for_it(gw):
    client = openai_client(gw.url)
    args = dict(model="tiny", prompt="usage", max_tokens=4, temperature=0, stream=True, extra_body={"ignore_eos": True})
    without = list(client.completions.create(**args))
    assert all(c.choices for c in without)  # the gateway asked the upstream for usage, and kept it
    asked = list(client.completions.create(**args, stream_options={"include_usage": True}))
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 4
    assert "".join(c.choices[0].text for c in without) == "".join(c.choices[0].text for c in asked if c.choices)


def test_models_merge_the_upstreams_and_health_names_them(gw, upstreams):
    assert [m["id"] for m in httpx2.get(f"{gw.url}/v1/models").json()["data"]] == ["tiny"]
    health = httpx2.get(f"{gw.url}/health").json()
    assert health["status"] == "ok" and health["scheduler"] == "vtc" and health["model"] == "tiny"
    assert [u["url"] for u in health["upstreams"]] == [u.url for u in upstreams]


def test_an_upstream_s_400_passes_through_and_nothing_stays_charged(gw):
    before = gw.wait_idle()
    r = httpx2.post(f"{gw.url}/v1/completions", json={"prompt": "x", "suffix": "z"}, headers={"X-Client-Id": "refused"})
    assert (
        r.status_code == 400 and "'suffix' is not supported" in r.json()["error"]["message"]
    )  # the upstream's own answer
    after = gw.wait_idle()
    assert after['slora_gateway_client_service{client="refused"}'] == 0
    assert after['slora_gateway_client_counter{client="refused"}'] == before.get(
        'slora_gateway_client_counter{client="refused"}', after['slora_gateway_client_counter{client="refused"}']
    )
    assert after['slora_gateway_requests_total{client="refused",outcome="rejected"}'] == 1
    with pytest.raises(BadRequestError):
        openai_client(gw.url).completions.create(model="tiny", prompt="x", max_tokens=2, suffix="z")


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"{not json", "the body is not valid JSON"),
        (b"[1, 2]", "the body must be a JSON object"),
        (b'{"prompt": "x", "max_tokens": "16"}', "max_tokens: Input should be a valid integer"),
        (b'{"prompt": "x", "stream": "yes"}', "stream: Input should be a valid boolean"),
        (b'{"prompt": "x", "max_tokens": 0}', "max_tokens: Input should be greater than 0"),
        (b'{"prompt": "x", "max_tokens": 2.5}', "max_tokens: Input should be a valid integer"),
        (b'{"prompt": "x", "n": 1.5}', "n: Input should be a valid integer"),
        (b'{"prompt": "x", "user": 5}', "user: Input should be a valid string"),
    ],
)
def test_bad_bodies_get_a_400_in_openai_s_shape(gw, raw, message):
    r = httpx2.post(f"{gw.url}/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (
        message in error["message"]
        and error["type"] == "invalid_request_error"
        and set(error) == {"message", "type", "param", "code"}
    )


def test_unknown_paths_methods_and_large_bodies_answer_in_openai_s_shape(gw):
    assert httpx2.get(f"{gw.url}/v1/nothing").json()["error"]["type"] == "not_found_error"
    r = httpx2.get(f"{gw.url}/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    r = httpx2.post(f"{gw.url}/v1/completions", content=b"x" * (2 << 20))
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_s_lora_generate_and_bench_http_work_through_the_gateway(gw, tmp_path):
    r = httpx2.post(
        f"{gw.url}/generate", json={"inputs": [3] * 5, "parameters": {"max_new_tokens": 3, "ignore_eos": True}}
    )
    assert r.status_code == 200 and r.json()["count_output_tokens"] == 3
    rows = [("alice", 4, 3, 0.0), ("bob", 6, 2, 0.01), ("alice", 5, 4, 0.02), ("carol", 3, 3, 0.03)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(json.dumps(dict(zip(("client", "prompt_len", "output_len", "req_time"), row))) + "\n" for row in rows)
    )
    out = tmp_path / "result.jsonl"
    assert main(["bench-http", str(trace), "--url", gw.url, "--out", str(out)]) == 0
    responses = read_results(out)[0].responses
    assert [(r.client, r.status, r.output_len) for r in responses] == [(c, "finished", o) for c, _, o, _ in rows]
    service = gw.wait_idle()
    assert service['slora_gateway_client_service{client="carol"}'] == 3 + 2 * 3  # h(x, y), exact token ids: no estimate


def test_a_client_that_leaves_while_queued_or_mid_stream_is_accounted_as_aborted():
    fake = FakeUpstream(hold_after=2)
    with fake_upstream(fake) as url, gateway(url, scheduler="vtc", max_inflight=1) as g:

        async def scenario():
            async with httpx2.AsyncClient(timeout=10) as http:
                body = {"prompt": "x", "max_tokens": 6, "stream": True}
                async with http.stream(
                    "POST", f"{g.url}/v1/completions", json=body, headers={"X-Client-Id": "gone"}
                ) as s:
                    lines = s.aiter_lines()
                    while not (await lines.__anext__()).startswith("data:"):
                        pass
                    queued = asyncio.create_task(
                        http.post(f"{g.url}/v1/completions", json=body, headers={"X-Client-Id": "queued"})
                    )
                    while g.per("client_waiting").get("queued") != 1:
                        await asyncio.sleep(0.01)
                    queued.cancel()
                    while g.per("client_waiting").get("queued", 0) != 0:
                        await asyncio.sleep(0.01)

        asyncio.run(scenario())
        m = g.wait_idle()
    assert m['slora_gateway_requests_total{client="gone",outcome="aborted"}'] == 1
    assert m['slora_gateway_requests_total{client="queued",outcome="aborted"}'] == 1
    assert m['slora_gateway_client_service{client="queued"}'] == 0


def test_a_stream_is_charged_while_it_runs_and_bodies_pass_through_untouched():
    fake = FakeUpstream(hold_after=5, prompt_tokens=7)
    with fake_upstream(fake) as url, gateway(url, scheduler="lcf", max_inflight=4) as g:
        body = {
            "prompt": "abcd" * 3,
            "max_tokens": 20,
            "stream": True,
            "logit_bias": {"5": 1},
            "vendor_field": [1, {"a": None}],
        }
        with httpx2.stream("POST", f"{g.url}/v1/completions", json=body, headers={"X-Client-Id": "long"}) as s:
            lines, seen = s.iter_lines(), 0
            while seen < 5:
                seen += next(lines).startswith("data:")
            # the fifth chunk is charged as it passes (the prompt estimated: 12 bytes, 3 tokens)
            wait_for(lambda: g.per("client_counter").get("long", 0) >= 3 + 2 * 4)
            running = g.metrics()
            assert (
                running['slora_gateway_client_counter{client="long"}'] == 3 + 2 * 4
            )  # h(3, 0), then 2 per token after the first
            assert running['slora_gateway_client_inflight{client="long"}'] == 1
            fake.release.set()
            rest = list(lines)
        assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"
        m = g.wait_idle()
        assert m['slora_gateway_client_counter{client="long"}'] == 7 + 2 * 19  # reconciled with usage: 7 prompt tokens
        assert m['slora_gateway_client_service{client="long"}'] == 7 + 2 * 20
        sent = fake.bodies[-1]
        # the rest untouched; the tenant added where vLLM's engine (and our plugin in it) reads it
        assert sent == {**body, "stream_options": {"include_usage": True}, "vllm_xargs": {"tenant": "long"}}
        httpx2.post(f"{g.url}/v1/completions", json={**body, "stream": False})
        assert fake.bodies[-1] == {**body, "stream": False, "vllm_xargs": {"tenant": "anonymous"}}


def test_the_budget_adapts_to_an_upstream_that_exposes_vllm_s_queue_and_is_fixed_otherwise():
    vllm, plain = FakeUpstream(hold_after=1, vllm_metrics=True), FakeUpstream()
    with fake_upstream(plain) as other, gateway(other, scheduler="vtc") as g:
        assert g.per("upstream_limit", "upstream") == {other: 64}  # without vLLM's metrics: fixed
    with fake_upstream(vllm) as url, gateway(url, scheduler="vtc", probe_interval_s=0.02) as g:
        limits = lambda: g.per("upstream_limit", "upstream")  # noqa: E731
        assert limits() == {url: 8}  # Aimd's start
        vllm.queued = 3
        wait_for(lambda: limits()[url] == 1, what="the budget to shrink to its floor while the upstream queues")
        vllm.queued = 0

        async def held_streams():
            async with httpx2.AsyncClient(timeout=20) as http:
                body = {"prompt": "x", "max_tokens": 3, "stream": True}
                tasks = [asyncio.create_task(http.post(f"{g.url}/v1/completions", json=body)) for _ in range(4)]
                # one more slot per probe while all are used and nothing queues upstream: 4 in flight, then 5 slots
                await asyncio.to_thread(
                    wait_for, lambda: limits()[url] == 5 and g.per("upstream_inflight", "upstream")[url] == 4
                )
                vllm.release.set()
                assert all(r.status_code == 200 for r in await asyncio.gather(*tasks))

        asyncio.run(held_streams())
        assert limits()[url] == 5 and g.wait_idle()["slora_gateway_waiting"] == 0


def test_clients_file_keys_weights_and_rate_limits(tmp_path):
    clients = tmp_path / "clients.toml"
    clients.write_text('[clients.alice]\napi_key = "sk-a"\nweight = 2.0\n\n[clients.bob]\napi_key = "sk-b"\nrpm = 1\n')
    fake = FakeUpstream()
    with fake_upstream(fake) as url, gateway(url, scheduler="vtc", clients_file=str(clients), max_inflight=2) as g:
        body = {"prompt": "x", "max_tokens": 2}
        assert httpx2.post(f"{g.url}/v1/completions", json=body).status_code == 401
        r = httpx2.post(f"{g.url}/v1/completions", json=body, headers={"Authorization": "Bearer sk-nope"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        ok = httpx2.post(
            f"{g.url}/v1/completions", json=body, headers={"Authorization": "Bearer sk-a", "X-Client-Id": "bob"}
        )
        assert ok.status_code == 200 and fake.bodies[-1] == {
            **body,
            "stream": True,
            "stream_options": {"include_usage": True},
            "vllm_xargs": {"tenant": "alice"},  # the key's client, not the header's
        }  # sent as a stream
        assert (
            "authorization" not in fake.headers[-1] and fake.headers[-1]["x-client-id"] == "alice"
        )  # the key stays here
        assert (
            httpx2.post(f"{g.url}/v1/completions", json=body, headers={"Authorization": "Bearer sk-b"}).status_code
            == 200
        )
        limited = httpx2.post(f"{g.url}/v1/completions", json=body, headers={"Authorization": "Bearer sk-b"})
        assert limited.status_code == 429 and limited.headers["retry-after"] == "1"
        m = g.wait_idle()
    # the key decides (not X-Client-Id); alice's weight 2 halves her counter: (7 + 2 * 1) / 2, reconciled to usage
    assert m['slora_gateway_client_counter{client="alice"}'] == (7 + 2) / 2
    assert m['slora_gateway_requests_total{client="bob",outcome="rejected"}'] == 1


def test_model_lookup_tokenize_and_version_pass_through_unscheduled(gw, upstreams):
    client = openai_client(gw.url)
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(NotFoundError):
        client.models.retrieve("no-such-model")
    body = {"model": "tiny", "prompt": "Hello"}
    assert (
        httpx2.post(f"{gw.url}/tokenize", json=body).json()
        == httpx2.post(f"{upstreams[0].url}/tokenize", json=body).json()
    )
    assert httpx2.get(f"{gw.url}/version").json() == httpx2.get(f"{upstreams[0].url}/version").json()
    assert gw.wait_idle()["slora_gateway_waiting"] == 0


def test_metrics_behind_a_key():
    with fake_upstream(FakeUpstream()) as url, gateway(url, metrics_key="secret") as g:
        refused = httpx2.get(f"{g.url}/metrics")
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert (
            "slora_gateway_waiting" in httpx2.get(f"{g.url}/metrics", headers={"Authorization": "Bearer secret"}).text
        )


def test_the_upstream_key_is_sent_and_a_client_s_own_key_passes_through_without_one():
    fake = FakeUpstream()
    body = {"prompt": "x", "max_tokens": 1}
    with fake_upstream(fake) as url:
        with gateway(url, upstream_api_key="up-key") as g:
            httpx2.post(f"{g.url}/v1/completions", json=body, headers={"Authorization": "Bearer client-key"})
            assert fake.headers[-1]["authorization"] == "Bearer up-key"
        with gateway(url) as g:
            httpx2.post(f"{g.url}/v1/completions", json=body, headers={"Authorization": "Bearer client-key"})
            assert fake.headers[-1]["authorization"] == "Bearer client-key"
