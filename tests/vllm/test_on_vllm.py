"""Our schedulers inside real vLLM (issue 19, item 3): a tiny random Llama served by vLLM as shipped
and by vLLM with the plugin (conftest.py starts each once), loaded by clients through the `openai`
client. Service is measured by the clients (tokens streamed per tenant in a window where every tenant
is backlogged), and the plugin's counters are read from its stats file.

Expected values, worked out by hand: every tenant's requests have the same prompt length and the same
distribution of output lengths, so a tenant's service is proportional to the tokens it receives. Two
tenants keeping 24 and 8 requests in flight get 3 : 1 from first-come-first-served vLLM (each holds
its share of the queue); VTC gives them 1 : 1, weights 2 : 1 give 2 : 1. The linear cost the plugin
charges is h(x, y) = x + 2 y with the first token free (it comes with the prefill, as in our engine):
x + 2 (y - 1) per request, x and y from the `usage` vLLM reports.
"""

import asyncio
import random
import time

import httpx
import pytest

from tests.vllm import load
from tests.vllm.load import (
    OUTPUT,
    PROMPT,
    RUN_S,
    WINDOW,
    Sampler,
    Served,
    assert_backlogged,
    batch,
    client,
    complete,
    prompt,
    run,
    wait_until,
)

pytestmark = pytest.mark.slow


def charged(usages: list[tuple[int, int]]) -> float:
    return sum(x + 2 * (y - 1) for x, y in usages)


def service_ratio(url: str, in_flight: dict[str, int]) -> float:
    return load.service_ratio(url, in_flight, RUN_S, WINDOW, PROMPT, OUTPUT)[0]


def backlogged_ratio(server, in_flight: dict[str, int]) -> float:
    """`service_ratio` with the plugin inside, having checked that every tenant had a request waiting in
    vLLM through the window (what "backlogged" means to a scheduler: load.py's note on OUTPUT)."""
    with Sampler(server.stats, every_s=0.5) as sampled:
        start = time.monotonic()
        ratio = service_ratio(server.url, in_flight)
    assert_backlogged(sampled.between(start + WINDOW[0], start + WINDOW[1]), in_flight)
    return ratio


def settled(server, tenants):
    """The stats once the plugin tracks no request and every tenant named has nothing waiting or running."""

    def check():
        stats = server.stats()
        rows = [stats["tenants"].get(t) for t in tenants]
        if stats["tracked"] == 0 and all(r and not r["waiting"] and not r["running"] for r in rows):
            return stats

    return wait_until(check, timeout_s=60)


def test_stock_vllm_serves_backlogged_tenants_as_they_load_it(stock_vllm):
    """3 : 1 within 25%, either way (the issue measured 3.1, a clean-clone CI run 2.45): service
    follows the load, far outside VTC's [0.8, 1.25]."""
    ratio = service_ratio(stock_vllm.url, {"heavy": 24, "light": 8})
    assert 0.75 * 3 <= ratio <= 1.25 * 3


def test_vtc_inside_vllm_serves_backlogged_tenants_equally(fair_vllm):
    ratio = backlogged_ratio(fair_vllm, {"heavy": 24, "light": 8})
    assert 0.8 <= ratio <= 1.25
    stats = settled(fair_vllm, ["heavy", "light"])  # the requests cancelled at the end were aborted
    assert stats["tenants"]["heavy"]["aborted"] > 0


def test_weights_two_to_one_give_two_to_one(fair_vllm):
    ratio = backlogged_ratio(fair_vllm, {"w2": 16, "w1": 16})
    assert 2 * 0.8 <= ratio <= 2 * 1.2


def test_counters_match_the_usage_vllm_reports(fair_vllm):
    requests = [(t, 8 + 9 * i, 3 + 7 * i) for i in range(6) for t in ("u1", "u2")]
    served = run(batch(fair_vllm.url, requests))
    stats = settled(fair_vllm, ["u1", "u2"])
    for tenant in ("u1", "u2"):
        usages = served[tenant].usages
        assert sorted(y for _, y in usages) == [3 + 7 * i for i in range(6)]  # ignore_eos: all of max_tokens
        row = stats["tenants"][tenant]
        assert row["finished"] == 6
        assert row["charged"] == charged(usages)
        assert row["output_tokens"] == sum(y for _, y in usages)
        assert row["prompt_tokens"] + row["cached_tokens"] == sum(x for x, _ in usages)


def test_a_client_that_leaves_leaves_no_state(fair_vllm):
    async def leave():
        api, rng, served = client(fair_vllm.url), random.Random(1), Served()
        tasks = [asyncio.create_task(complete(api, "gone", prompt(rng, 16), 400, served)) for _ in range(7)]
        while len(served.token_times) < 3:  # some run (4 at most), the others wait
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await api.close()

    run(asyncio.wait_for(leave(), timeout=120))
    stats = settled(fair_vllm, ["gone"])
    row = stats["tenants"]["gone"]
    assert row["aborted"] == 7 and row["finished"] == 0
    assert row["output_tokens"] < 7 * 400


def test_a_rate_limited_request_gets_an_error_not_a_hang(fair_vllm):
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}
    headers = {"X-Client-Id": "limited"}
    answers = [httpx.post(f"{fair_vllm.url}/v1/completions", json=body, headers=headers, timeout=60) for _ in range(3)]
    assert [a.status_code for a in answers[:2]] == [200, 200]
    assert answers[2].status_code == 500
    assert set(answers[2].json()["error"]) >= {"message", "type", "code"}
    stats = settled(fair_vllm, ["limited"])
    assert stats["tenants"]["limited"]["rejected"] == 1


def test_a_tenant_that_is_not_a_string_gets_vllms_400(fair_vllm):
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "vllm_xargs": {"tenant": 7}}
    answer = httpx.post(f"{fair_vllm.url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "BadRequestError"


def test_under_preemption_the_victims_are_the_largest_counters_and_all_ends_well(small_kv_vllm):
    requests = [(t, 100, 150) for _ in range(4) for t in ("p", "q")]
    served = run(batch(small_kv_vllm.url, requests))
    stats = settled(small_kv_vllm, ["p", "q"])
    victims = stats["victims"]
    assert len(victims) > 0, "vLLM preempted nothing: the KV cache is not small enough"
    assert all(v["counter"] is not None for v in victims)  # the plugin had ordered the running list
    assert all(v["counter"] >= v["largest_kept"] for v in victims if v["largest_kept"] is not None)
    for tenant in ("p", "q"):
        usages = served[tenant].usages
        assert usages == [(100, 150)] * 4
        row = stats["tenants"][tenant]
        assert row["finished"] == 4
        assert row["charged"] == charged(usages)
