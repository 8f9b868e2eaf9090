"""Requests that do not stream, through the gateway: sent upstream as streams, charged while they
run, answered whole. Their answers equal the upstream's own (our `serve`, tiny model, through the
official `openai` client); a held answer is charged before it ends; a broken one is a 502 with
everything refunded; requests whose answer cannot be re-assembled are passed through, charged
their max_tokens at dispatch, then their usage."""

import asyncio
import json
import threading

import httpx2
import pytest
from openai import OpenAI

from slora_vtc.gateway.api import COMPLETIONS
from slora_vtc.gateway.assemble import Assembled, Unassembled, assembles
from tests.helpers.gateway import FakeUpstream, fake_upstream, gateway, wait_for
from tests.helpers.server import running_server

STREAMED = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def serve():
    with running_server(pool_tokens=2000) as srv:
        yield srv


@pytest.fixture(scope="module")
def gw(serve):
    with gateway(serve.url, scheduler="vtc", max_inflight=2) as g:
        yield g


@pytest.fixture
def sent(gw) -> list[dict]:
    """The bodies the gateway sends its upstream during the test."""
    bodies: list[dict] = []

    async def record(request: httpx2.Request) -> None:
        if request.method == "POST":
            bodies.append(json.loads(request.content))

    gw.ctx.http.event_hooks = {"request": [record], "response": []}
    yield bodies
    gw.ctx.http.event_hooks = {"request": [], "response": []}


def openai_client(url: str, client: str = "whole") -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, default_headers={"X-Client-Id": client})


def _comparable(answer) -> dict:
    """The answer without what differs between two calls (its id and creation time)."""
    return answer.model_dump(exclude={"id", "created"})


COMPLETION_CASES = {
    "logprobs": dict(prompt="Hello, gateway", max_tokens=8, logprobs=2),
    "n=2, several prompts": dict(prompt=["One prompt", "and another"], max_tokens=5, n=2, logprobs=0),
    "token ids": dict(prompt=[5, 9, 13, 2], max_tokens=6),
    "echo": dict(prompt="Echo me", max_tokens=4, echo=True),
    "seeded sampling": dict(prompt="Sampled", max_tokens=6, n=2, temperature=1.0, seed=11),
}


@pytest.mark.parametrize("case", COMPLETION_CASES)
def test_a_whole_completion_through_the_gateway_equals_the_upstream_s_own(gw, serve, sent, case):
    args = {"model": "tiny", "temperature": 0, "extra_body": {"ignore_eos": True}, **COMPLETION_CASES[case]}
    client = f"c-{case}"
    direct, through = (
        openai_client(serve.url).completions.create(**args),
        openai_client(gw.url, client).completions.create(**args),
    )
    assert _comparable(through) == _comparable(direct)
    assert [b["stream"] for b in sent] == [True] and sent[0]["stream_options"] == {
        "include_usage": True
    }  # it went as a stream
    prompts = len(args["prompt"]) if isinstance(args["prompt"], list) and isinstance(args["prompt"][0], str) else 1
    assert len(through.choices) == prompts * args.get("n", 1)
    assert all(c.finish_reason == "length" for c in through.choices) and through.usage.completion_tokens == args[
        "max_tokens"
    ] * len(through.choices)
    if "logprobs" in args:
        assert all(len(c.logprobs.tokens) == args["max_tokens"] for c in through.choices)
    m = gw.wait_idle()
    assert m[f'slora_gateway_requests_total{{client="{client}",outcome="finished"}}'] == 1
    if not args.get(
        "echo"
    ):  # the ledger is h(x, y) of the usage (echo: see test_the_echoed_prompt_s_chunk_is_charged_as_a_token)
        assert (
            m[f'slora_gateway_client_service{{client="{client}"}}']
            == through.usage.prompt_tokens + 2 * through.usage.completion_tokens
        )


def test_stop_strings_end_a_whole_answer_as_the_upstream_s_own(gw, serve):
    args = dict(model="tiny", prompt="Stop somewhere", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    text = openai_client(serve.url).completions.create(**args).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    direct = openai_client(serve.url).completions.create(**args, stop=[stop])
    through = openai_client(gw.url, "stopper").completions.create(**args, stop=[stop])
    assert (
        direct.choices[0].finish_reason == "stop" and stop not in direct.choices[0].text
    )  # the stop string ended it, trimmed
    assert _comparable(through) == _comparable(direct)
    assert through.choices[0].model_extra["stop_reason"] == stop  # vLLM's extension, carried over from the last chunk
    chat = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    said = openai_client(serve.url).chat.completions.create(**chat).choices[0].message.content
    stop = said[len(said) // 2 : len(said) // 2 + 2]
    direct = openai_client(serve.url).chat.completions.create(**chat, stop=stop)
    assert direct.choices[0].finish_reason == "stop"
    assert _comparable(openai_client(gw.url, "stopper").chat.completions.create(**chat, stop=stop)) == _comparable(
        direct
    )


@pytest.mark.parametrize("extra", [{}, {"logprobs": True, "top_logprobs": 2, "n": 2}], ids=["plain", "logprobs n=2"])
def test_a_whole_chat_completion_through_the_gateway_equals_the_upstream_s_own(gw, serve, sent, extra):
    args = dict(
        model="tiny",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
        **extra,
    )
    direct = openai_client(serve.url).chat.completions.create(**args)
    through = openai_client(gw.url, "chatter").chat.completions.create(**args)
    assert _comparable(through) == _comparable(direct)
    assert [b["stream"] for b in sent] == [True]
    assert through.object == "chat.completion" and all(c.message.role == "assistant" for c in through.choices)
    assert len(through.choices) == extra.get("n", 1) and through.usage.completion_tokens == 6 * len(through.choices)
    if extra:
        assert all(
            len(c.logprobs.content) == 6 and all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
            for c in through.choices
        )
    assert gw.wait_idle()["slora_gateway_waiting"] == 0


def test_the_echoed_prompt_s_chunk_is_charged_as_a_token(gw):
    """Known over-charge, shared with streams: `serve` sends the echoed prompt as a chunk of its own,
    which counts as a token, and usage only corrects a count upwards. One token per choice."""
    reply = openai_client(gw.url, "echoer").completions.create(
        model="tiny", prompt=[4, 8, 15], max_tokens=3, echo=True, temperature=0, extra_body={"ignore_eos": True}
    )
    assert gw.wait_idle()['slora_gateway_client_service{client="echoer"}'] == 3 + 2 * (3 + 1)
    assert reply.usage.completion_tokens == 3


def test_a_whole_answer_is_charged_while_it_is_produced():
    fake = FakeUpstream(hold_after=5, prompt_tokens=7)
    with fake_upstream(fake) as url, gateway(url, scheduler="vtc", max_inflight=4) as g:
        body = {"prompt": "abcd" * 3, "max_tokens": 20, "temperature": 0}
        answer: dict = {}
        asker = threading.Thread(
            target=lambda: answer.update(
                httpx2.post(f"{g.url}/v1/completions", json=body, headers={"X-Client-Id": "long"}, timeout=30).json()
            )
        )
        asker.start()
        # five chunks have passed: h(3, 0) for the estimated prompt (12 bytes), then 2 for each token after the first
        wait_for(
            lambda: g.per("client_counter").get("long", 0) == 3 + 2 * 4, what="the first five tokens to be charged"
        )
        running = g.metrics()
        assert (
            running['slora_gateway_client_inflight{client="long"}'] == 1 and not answer
        )  # still in flight, not answered
        assert running['slora_gateway_client_service{client="long"}'] == 3 + 2 * 5
        assert fake.bodies[-1] == {**body, **STREAMED, "vllm_xargs": {"tenant": "long"}}
        fake.release.set()
        asker.join(timeout=30)
        m = g.wait_idle()
    assert answer == {
        "id": "c",
        "object": "text_completion",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "text": "x" * 20, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 20, "total_tokens": 27},
    }
    assert m['slora_gateway_client_counter{client="long"}'] == 7 + 2 * 19  # reconciled with usage: 7 prompt tokens
    assert m['slora_gateway_client_service{client="long"}'] == 7 + 2 * 20
    assert m['slora_gateway_requests_total{client="long",outcome="finished"}'] == 1


@pytest.mark.parametrize("breaks", ["event", "cut", "half", "end"])
def test_an_answer_broken_mid_way_is_a_502_and_refunded(breaks):
    fake = FakeUpstream(break_after=4, breaks=breaks)
    with fake_upstream(fake) as url, gateway(url, scheduler="vtc", max_inflight=1) as g:
        reply = httpx2.post(
            f"{g.url}/v1/completions", json={"prompt": "abcd", "max_tokens": 10}, headers={"X-Client-Id": "broken"}
        )
        m = g.wait_idle()
    assert reply.status_code == 502
    error = reply.json()["error"]
    assert (
        set(error) == {"message", "type", "param", "code"}
        and error["code"] == "upstream_error"
        and url in error["message"]
    )
    if breaks == "event":
        assert "the fake upstream broke" in error["message"]  # the upstream's own message
    assert (
        m['slora_gateway_client_counter{client="broken"}'] == 0
        and m['slora_gateway_client_service{client="broken"}'] == 0
    )
    assert m['slora_gateway_requests_total{client="broken",outcome="failed"}'] == 1
    assert m[f'slora_gateway_upstream_errors_total{{upstream="{url}"}}'] == 1


def test_a_client_that_leaves_a_whole_answer_is_aborted_and_keeps_what_was_produced():
    fake = FakeUpstream(hold_after=3)
    with fake_upstream(fake) as url, gateway(url, scheduler="vtc", max_inflight=1) as g:

        async def leave():
            async with httpx2.AsyncClient(timeout=10) as http:
                asked = asyncio.create_task(
                    http.post(
                        f"{g.url}/v1/completions",
                        json={"prompt": [1, 2], "max_tokens": 8},
                        headers={"X-Client-Id": "leaver"},
                    )
                )
                await asyncio.to_thread(wait_for, lambda: g.per("client_counter").get("leaver", 0) == 2 + 2 * 2)
                asked.cancel()

        asyncio.run(leave())
        m = g.wait_idle()
        fake.release.set()
    assert m['slora_gateway_requests_total{client="leaver",outcome="aborted"}'] == 1
    assert m['slora_gateway_client_counter{client="leaver"}'] == 2 + 2 * 2  # h(2, 0), then the second and third tokens


@pytest.mark.parametrize(
    "scheduler, predicted, settled",
    [
        (
            "vtc",
            3 + 2 * 19,
            7 + 2 * 4,
        ),  # h(x, 0) at dispatch plus the prediction of tokens 2..20; then usage: 5 tokens, 7 prompt tokens
        (
            "vtc-oracle",
            3 + 2 * 20,
            7 + 2 * 5,
        ),  # the scheduler predicts max_tokens itself: nothing more is charged; h(x, y) at the end
    ],
)
def test_a_request_that_cannot_be_re_assembled_is_passed_through_and_charged_its_max_tokens_at_dispatch(
    scheduler, predicted, settled
):
    fake = FakeUpstream(hold_after=0, prompt_tokens=7, output_tokens=5)
    with fake_upstream(fake) as url, gateway(url, scheduler=scheduler, max_inflight=1) as g:
        body = {"prompt": "abcd" * 3, "max_tokens": 20, "vendor_field": {"a": 1}}  # a field the gateway does not know
        asker = threading.Thread(
            target=httpx2.post,
            args=(f"{g.url}/v1/completions",),
            kwargs={"json": body, "headers": {"X-Client-Id": "opaque"}},
        )
        asker.start()
        wait_for(lambda: fake.bodies, what="the request to reach the upstream")
        assert fake.bodies[-1] == {
            **body,
            "vllm_xargs": {"tenant": "opaque"},
        }  # as it was (the tenant added): not a stream
        assert g.per("client_counter")["opaque"] == predicted
        fake.release.set()
        asker.join(timeout=30)
        m = g.wait_idle()
    assert m['slora_gateway_client_counter{client="opaque"}'] == settled
    assert m['slora_gateway_client_service{client="opaque"}'] == 7 + 2 * 5


def test_which_requests_are_re_assembled():
    assert assembles({"model": "m", "prompt": "x", "n": 2, "best_of": 2, "logprobs": 1, "ignore_eos": True}, chat=False)
    assert not assembles({"prompt": "x", "n": 1, "best_of": 3}, chat=False)  # best_of > n cannot be streamed
    assert not assembles({"prompt": "x", "echo": True, "logprobs": 0}, chat=False)  # the prompt's logprobs
    assert not assembles(
        {"prompt": "x", "stream_options": {"include_usage": True}}, chat=False
    )  # the upstream's 400 stays
    assert assembles({"messages": [], "logprobs": True, "top_logprobs": 2, "max_completion_tokens": 4}, chat=True)
    assert not assembles({"messages": [], "tools": [], "tool_choice": "auto"}, chat=True)


def _chunk(choices: list[dict], **envelope) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m", **envelope, "choices": choices}


def test_vllm_s_completion_chunks_make_its_whole_answer():
    """Chunks shaped as vLLM streams them (every choice field present, null until used; usage last,
    with its nulls left out), two choices interleaved; the expected answer written out by hand."""

    def choice(i, text, lp, finish=None, stop=None):
        return {
            "index": i,
            "text": text,
            "logprobs": lp,
            "finish_reason": finish,
            "stop_reason": stop,
            "prompt_token_ids": None,
            "token_ids": None,
        }

    def lp(token, value, offset):
        return {"text_offset": [offset], "token_logprobs": [value], "tokens": [token], "top_logprobs": [{token: value}]}

    whole = Assembled(chat=False)
    for chunk in [
        _chunk([choice(0, "Hel", lp("Hel", -0.5, 0))]),
        _chunk([choice(1, "A", lp("A", -1.0, 0))]),
        _chunk([choice(0, "lo", lp("lo", -0.25, 3), finish="stop", stop="!")], system_fingerprint="fp"),
        _chunk([choice(1, "", lp("\n", -2.0, 1), finish="length")]),
        _chunk([], usage={"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}),
    ]:
        whole.add(chunk)
    assert whole.result() == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 5,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [
            {
                "index": 0,
                "text": "Hello",
                "finish_reason": "stop",
                "stop_reason": "!",
                "logprobs": {
                    "text_offset": [0, 3],
                    "token_logprobs": [-0.5, -0.25],
                    "tokens": ["Hel", "lo"],
                    "top_logprobs": [{"Hel": -0.5}, {"lo": -0.25}],
                },
            },
            {
                "index": 1,
                "text": "A",
                "finish_reason": "length",
                "stop_reason": None,
                "logprobs": {
                    "text_offset": [0, 1],
                    "token_logprobs": [-1.0, -2.0],
                    "tokens": ["A", "\n"],
                    "top_logprobs": [{"A": -1.0}, {"\n": -2.0}],
                },
            },
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8},
    }


def test_openai_s_chat_chunks_make_its_whole_answer_and_a_tool_call_is_refused():
    whole = Assembled(chat=True)
    envelope = {"object": "chat.completion.chunk", "service_tier": "default", "obfuscation": "xyz", "usage": None}
    token = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}
    for delta, finish, lps in [
        ({"role": "assistant", "content": "", "refusal": None}, None, None),
        ({"content": "Hi"}, None, {"content": [token], "refusal": None}),
        ({"content": " there"}, None, {"content": [{**token, "token": " there"}], "refusal": None}),
        ({}, "stop", None),
    ]:
        whole.add(_chunk([{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}], **envelope))
    whole.add(_chunk([], **{**envelope, "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}))
    assert whole.result() == {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 5,
        "model": "m",
        "service_tier": "default",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi there"},
                "finish_reason": "stop",
                "logprobs": {"content": [token, {**token, "token": " there"}], "refusal": None},
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    with pytest.raises(Unassembled, match="tool_calls"):
        Assembled(chat=True).add(_chunk([{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]))


def test_older_vllm_s_error_event_is_an_error():
    assert COMPLETIONS.is_error({"object": "error", "message": "boom", "type": "BadRequestError", "code": 400})
    assert not COMPLETIONS.is_error(_chunk([]))


@pytest.mark.parametrize("breaks", ["cut", "half"])
def test_a_stream_broken_mid_event_relays_only_whole_events_then_an_error(breaks):
    """Found against real vLLM killed mid-run: half a data line went on to the client as an event."""
    fake = FakeUpstream(break_after=4, breaks=breaks)
    with fake_upstream(fake) as url, gateway(url, scheduler="vtc", max_inflight=1) as g:
        with httpx2.stream(
            "POST",
            f"{g.url}/v1/completions",
            json={"prompt": "abcd", "max_tokens": 10, "stream": True},
            headers={"X-Client-Id": "broken"},
        ) as reply:
            events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
        g.wait_idle()
    parsed = [json.loads(e) for e in events if e != "[DONE]"]  # every event relayed is whole JSON
    assert [p["choices"][0]["text"] for p in parsed[:-1]] == ["x"] * 4
    assert parsed[-1]["error"]["code"] == "upstream_error"
