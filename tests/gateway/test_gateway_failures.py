"""Upstreams that fail: one killed in the middle of a flood, one that never answers. Every
request ends finished or with a clear error, the failed ones are refunded, and afterwards nothing
is queued or in flight and the gateway's ledger equals what the finished requests received."""

import asyncio
import json

import httpx2

from tests.helpers.gateway import FakeUpstream, fake_upstream, gateway, upstream, wait_for

CLIENTS = ("a", "b", "c")
PER_CLIENT = 8
PROMPT, OUTPUT = 8, 48


async def _request(http: httpx2.AsyncClient, url: str, client: str, stream: bool) -> tuple[str, int]:
    """("finished", h(x, y) from usage) or ("error", 0) for an OpenAI-shaped error, as status or event."""
    body = {"prompt": [3] * PROMPT, "max_tokens": OUTPUT, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with http.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Client-Id": client}) as reply:
        if reply.status_code != 200:
            error = json.loads(await reply.aread())["error"]
            assert reply.status_code in (502, 503, 504) and error["type"] == "server_error" and error["message"]
            return "error", 0
        if not stream:
            usage = json.loads(await reply.aread())["usage"]
            return "finished", usage["prompt_tokens"] + 2 * usage["completion_tokens"]
        events = [
            json.loads(line[6:]) for line in [line async for line in reply.aiter_lines()] if line.startswith("data: {")
        ]
    if any("error" in e for e in events):
        assert all(e["error"]["message"] for e in events if "error" in e)
        return "error", 0
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == OUTPUT
    return "finished", usage["prompt_tokens"] + 2 * usage["completion_tokens"]


def test_an_upstream_killed_mid_run_loses_no_accounting():
    with (
        upstream(pool_tokens=2000) as doomed,
        upstream(pool_tokens=2000) as survivor,
        gateway(doomed.url, survivor.url, scheduler="vtc", max_inflight=2) as gw,
    ):

        async def flood():
            async with httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=None)) as http:
                tasks = [
                    asyncio.create_task(_request(http, gw.url, c, stream=i % 3 != 2))
                    for i in range(PER_CLIENT)
                    for c in CLIENTS
                ]
                await asyncio.to_thread(
                    wait_for, lambda: gw.per("upstream_inflight", "upstream").get(doomed.url, 0) >= 1
                )
                await asyncio.to_thread(doomed.kill)
                return await asyncio.gather(*tasks)

        outcomes = asyncio.run(flood())
        m = gw.wait_idle()
    clients = [c for _ in range(PER_CLIENT) for c in CLIENTS]
    assert len(outcomes) == len(clients)
    errors = sum(status == "error" for status, _ in outcomes)
    assert 1 <= errors < len(outcomes)  # the killed upstream's requests failed; the survivor served the rest
    assert m[f'slora_gateway_upstream_errors_total{{upstream="{doomed.url}"}}'] >= 1
    assert m[f'slora_gateway_upstream_up{{upstream="{doomed.url}"}}'] == 0
    assert m[f'slora_gateway_upstream_errors_total{{upstream="{survivor.url}"}}'] == 0
    for client in CLIENTS:
        mine = [o for o, c in zip(outcomes, clients) if c == client]
        assert m[f'slora_gateway_client_service{{client="{client}"}}'] == sum(s for _, s in mine)  # failures refunded
        assert m[f'slora_gateway_requests_total{{client="{client}",outcome="finished"}}'] == sum(
            st == "finished" for st, _ in mine
        )
        assert m[f'slora_gateway_requests_total{{client="{client}",outcome="failed"}}'] == sum(
            st == "error" for st, _ in mine
        )
    assert gw.ctx.dispatcher.scheduler.num_waiting() == 0


def test_an_upstream_that_never_answers_is_a_504_and_nothing_stays_charged():
    with (
        fake_upstream(FakeUpstream(hang=True)) as url,
        gateway(url, scheduler="lcf", max_inflight=1, upstream_timeout_s=0.3) as gw,
    ):
        r = httpx2.post(
            f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 4}, headers={"X-Client-Id": "late"}
        )
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "upstream_timeout" and url in r.json()["error"]["message"]
        m = gw.wait_idle()
    assert m[f'slora_gateway_upstream_timeouts_total{{upstream="{url}"}}'] == 1
    assert (
        m['slora_gateway_client_service{client="late"}'] == 0 and m['slora_gateway_client_counter{client="late"}'] == 0
    )
    assert m['slora_gateway_requests_total{client="late",outcome="failed"}'] == 1


def test_requests_for_an_upstream_that_went_away_move_to_one_that_is_up():
    with (
        upstream(pool_tokens=2000) as gone,
        upstream(pool_tokens=2000) as live,
        gateway(gone.url, live.url, scheduler="vtc", max_inflight=2) as gw,
    ):
        gone.kill()  # before any request: the gateway learns of it from its first connection
        body = {"prompt": [3] * 4, "max_tokens": 3, "ignore_eos": True}
        replies = [
            httpx2.post(f"{gw.url}/v1/completions", json=body, headers={"X-Client-Id": "mover"}) for _ in range(4)
        ]
        assert [r.status_code for r in replies] == [200] * 4  # nothing was sent to the dead one: moved, not failed
        m = gw.wait_idle()
    assert m[f'slora_gateway_upstream_errors_total{{upstream="{gone.url}"}}'] == 1
    assert m[f'slora_gateway_upstream_up{{upstream="{gone.url}"}}'] == 0
    assert m[f'slora_gateway_upstream_finished_total{{upstream="{live.url}"}}'] == 4
    assert m['slora_gateway_client_service{client="mover"}'] == 4 * (
        4 + 2 * 3
    )  # token ids: no BOS added; 3 tokens each
