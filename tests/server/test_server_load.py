"""Load: 200 concurrent streaming requests from 20 clients; every request is accounted for, on the
client side and in /metrics, and nothing is left in the pool. One client is rate limited (its
excess gets 429) and some clients hang up mid-stream (their requests are aborted). Under S-LoRA's
loop, and under vLLM's chunked steps in a pool small enough that they preempt."""

import asyncio
import json

import httpx2
import pytest

from tests.helpers.server import running_server

CLIENTS, PER_CLIENT = 20, 10
LIMITED_RPM = 5  # client c0: its last 5 requests are refused
LEAVERS = {"c1", "c2"}  # these hang up after their first token
LEAVER_TOKENS = 300  # long enough to be running still when the hang-up reaches the server
# vLLM's steps: prompts admitted greedily by blocks into a pool of 480 tokens (30 blocks), so that running
# requests are preempted by recompute and hang-ups reach requests running, waiting and preempted alike
CHUNKED = dict(batching="chunked", max_num_batched_tokens=64, max_num_seqs=64, block_size=16, pool_tokens=480)
# with the prefix cache, in blocks of 4 tokens: the clients' prompts of one k (5 to 14 tokens) share whole blocks
PREFIX_CACHE = dict(prefix_cache=True, block_size=4)


async def one(http: httpx2.AsyncClient, url: str, client: str, k: int) -> str:
    max_tokens = LEAVER_TOKENS if client in LEAVERS else 8 + k
    body = {
        "prompt": [1] + [3 + k] * (4 + k),
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "user": client,
    }
    async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code == 429:
            return "rejected"
        assert r.status_code == 200
        events = []
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                events.append(line[5:].strip())
                if client in LEAVERS:
                    return "aborted"  # leaving the block closes the connection
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length"
    return "finished"


async def flood(url: str) -> list[str]:
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
        jobs = [one(http, url, f"c{i}", k) for k in range(PER_CLIENT) for i in range(CLIENTS)]
        return await asyncio.gather(*jobs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "batching",
    [{"pool_tokens": 4000}, CHUNKED, CHUNKED | PREFIX_CACHE, CHUNKED | PREFIX_CACHE | {"engine_process": True}],
    ids=["slora", "chunked", "chunked-prefix-cache", "chunked-prefix-cache-engine-process"],
)
def test_200_concurrent_streams_from_20_clients(tmp_path, batching):
    clients = tmp_path / "clients.toml"
    clients.write_text(f"[clients.c0]\nrpm = {LIMITED_RPM}\n")
    steps = tmp_path / "steps.jsonl"
    with running_server(clients_file=str(clients), step_log=str(steps), **batching) as srv:
        outcomes = asyncio.run(flood(srv.url))
        m = srv.wait_idle()
    sent = CLIENTS * PER_CLIENT
    assert len(outcomes) == sent
    assert outcomes.count("rejected") == PER_CLIENT - LIMITED_RPM
    assert outcomes.count("aborted") == len(LEAVERS) * PER_CLIENT
    assert outcomes.count("finished") == sent - (PER_CLIENT - LIMITED_RPM) - len(LEAVERS) * PER_CLIENT

    def total(outcome: str) -> float:
        return sum(v for k, v in m.items() if k.startswith("slora_requests_total{") and f'outcome="{outcome}"' in k)

    admitted = sum(v for k, v in m.items() if k.startswith("slora_requests_admitted_total{"))
    assert admitted + total("rejected") == sent
    assert total("finished") + total("aborted") + total("failed") == admitted
    # a leaver may have been served to the end before its hang-up reached the engine
    assert 0 < total("aborted") <= outcomes.count("aborted")
    assert total("finished") >= outcomes.count("finished")
    assert m["slora_pool_used_tokens"] == m["slora_pool_cached_tokens"]  # nothing held but what the cache keeps
    if batching.get("prefix_cache"):
        assert sum(v for k, v in m.items() if k.startswith("slora_served_input_tokens_cached_total{")) > 0
    else:
        assert m["slora_pool_cached_tokens"] == 0
    if batching.get("batching"):  # the load preempted running requests (vLLM's rule); each ended all the same
        assert sum(json.loads(line).get("preempted", 0) for line in steps.read_text().splitlines()) > 0
