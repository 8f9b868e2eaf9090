"""The gateway in front of a fair scheduler inside the upstream (vLLM with our plugin): the tenant
travels in the body's `vllm_xargs.tenant`, and `--scheduler passthrough` sends every request on at
once while the gateway's ledger still counts each client's service."""

import asyncio

import httpx2
import pytest

from slora_vtc.gateway.api import COMPLETIONS, GENERATE, Tenant, with_tenant
from slora_vtc.sched import build_scheduler
from tests.helpers.gateway import FakeUpstream, fake_upstream, gateway, wait_for


@pytest.mark.parametrize(
    ("body", "tenant", "expected"),
    [
        ({"prompt": "x"}, Tenant("a", False), {"prompt": "x", "vllm_xargs": {"tenant": "a"}}),
        ({"vllm_xargs": {"k": 1}}, Tenant("a", False), {"vllm_xargs": {"k": 1, "tenant": "a"}}),
        ({"vllm_xargs": None}, Tenant("a", False), {"vllm_xargs": {"tenant": "a"}}),
        ({"vllm_xargs": {"tenant": "own"}}, Tenant("a", False), {"vllm_xargs": {"tenant": "own"}}),  # kept
        ({"vllm_xargs": {"tenant": "own"}}, Tenant("a", True), {"vllm_xargs": {"tenant": "a"}}),  # the key decides
        ({"vllm_xargs": "junk"}, Tenant("a", True), {"vllm_xargs": "junk"}),  # the upstream's 400 stays
    ],
)
def test_the_tenant_goes_in_vllm_xargs(body, tenant, expected):
    before = repr(body)
    assert with_tenant(body, tenant) == expected
    assert repr(body) == before  # the client's body is not changed in place


def test_only_openai_bodies_carry_the_tenant():
    routing = COMPLETIONS.route({"prompt": "x", "stream": True})
    assert b'"vllm_xargs": {"tenant": "a"}' in COMPLETIONS.upstream_body(
        {"prompt": "x"}, routing, tenant=Tenant("a", 0)
    )
    generate = {"inputs": "x", "parameters": {}}
    assert b"vllm_xargs" not in GENERATE.upstream_body(generate, GENERATE.route(generate), tenant=Tenant("a", 0))


def test_passthrough_is_fcfs_that_defers():
    scheduler = build_scheduler("passthrough", ["a"])
    assert scheduler.traits.defers and not scheduler.traits.ledger
    assert not build_scheduler("fcfs", ["a"]).traits.defers and not build_scheduler("vtc", ["a"]).traits.defers


def test_passthrough_sends_every_request_on_at_once_and_still_counts_service():
    """An upstream that exposes vLLM's metrics holds 12 streams: under passthrough the gateway sends all
    12 at once (no adaptive budget, nothing waits in the gateway) and counts each client's service."""
    fake = FakeUpstream(hold_after=1, vllm_metrics=True, prompt_tokens=5, output_tokens=3)
    fake.queued = 50  # what would cut an adaptive budget to its floor
    with fake_upstream(fake) as url, gateway(url, scheduler="passthrough", probe_interval_s=0.02) as g:

        async def held():
            async with httpx2.AsyncClient(timeout=30) as http:
                body = {"prompt": "x", "max_tokens": 3, "stream": True}
                tasks = [
                    asyncio.create_task(
                        http.post(f"{g.url}/v1/completions", json=body, headers={"X-Client-Id": f"c{i % 2}"})
                    )
                    for i in range(12)
                ]
                await asyncio.to_thread(wait_for, lambda: len(fake.bodies) == 12, what="all 12 at the upstream")
                assert g.metrics()["slora_gateway_waiting"] == 0
                fake.release.set()
                return await asyncio.gather(*tasks)

        answers = asyncio.run(held())
        assert all(a.status_code == 200 for a in answers)
        assert {b["vllm_xargs"]["tenant"] for b in fake.bodies} == {"c0", "c1"}
        m = g.wait_idle()
        assert g.per("upstream_limit", "upstream") == {url: 4096}  # not adapted, though the metrics are there
        # 6 requests each of h(5, 3) = 5 + 2 * 3, from the usage
        assert g.per("client_service") == {"c0": 6 * 11, "c1": 6 * 11, "other": 0}
        assert m['slora_gateway_requests_total{client="c0",outcome="finished"}'] == 6
