"""docs/extending.md's plugin scheduler (examples/plugins/round_robin.py), which implements only the
six methods every scheduler must, served through `serve` and through the gateway: a request that
leaves while it waits is aborted, and the queue goes on serving."""

import asyncio
import sys
import time

import httpx2
import pytest

from slora_vtc.plugins import load_plugins
from slora_vtc.sched import SCHEDULERS
from tests.helpers.files import PLUGIN
from tests.helpers.gateway import FakeUpstream, fake_upstream, gateway
from tests.helpers.server import running_server


@pytest.fixture(autouse=True, scope="module")
def plugin():
    """`rr` registered as `--plugin` does it, for this module's tests only (the registry is the process's)."""
    before, modules = dict(SCHEDULERS), set(sys.modules)
    load_plugins([str(PLUGIN)])
    yield
    SCHEDULERS.clear()
    SCHEDULERS.update(before)
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_serve_aborts_a_request_of_the_plugin_scheduler_that_leaves_while_it_waits():
    with running_server(pool_tokens=2000, scheduler="rr") as server:

        def aborted(client: str) -> float:
            return server.per_client("requests_total", outcome="aborted").get(client, 0)

        async def scenario():
            async with httpx2.AsyncClient(timeout=30) as http:
                long = {"inputs": [1, 2, 3], "parameters": {"max_new_tokens": 1990, "ignore_eos": True}}
                async with http.stream(
                    "POST", f"{server.url}/generate_stream", json=long, headers={"X-Client-Id": "hog"}
                ) as r1:
                    lines = r1.aiter_lines()
                    await anext(lines)
                    queued = {"inputs": [1, 2], "parameters": {"max_new_tokens": 1000}}  # cannot run beside the hog
                    async with http.stream(
                        "POST", f"{server.url}/generate_stream", json=queued, headers={"X-Client-Id": "waiter"}
                    ) as r2:
                        assert r2.status_code == 200
                        assert server.per_client("client_waiting").get("waiter") == 1
                    await asyncio.to_thread(wait_for, lambda: aborted("waiter") == 1)

        asyncio.run(scenario())
        wait_for(lambda: aborted("hog") == 1)
        m = server.wait_idle()
        assert m['slora_served_output_tokens_total{client="waiter"}'] == 0
        after = httpx2.post(
            f"{server.url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 3, "ignore_eos": True}
        )
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 3


def test_the_gateway_serves_the_plugin_scheduler_and_withdraws_a_request_that_leaves_while_queued():
    fake = FakeUpstream(hold_after=2)
    with fake_upstream(fake) as url, gateway(url, scheduler="rr", max_inflight=1) as g:

        async def scenario():
            async with httpx2.AsyncClient(timeout=10) as http:
                body = {"prompt": "x", "max_tokens": 4, "stream": True}
                async with http.stream("POST", f"{g.url}/v1/completions", json=body, headers={"X-Client-Id": "a"}) as s:
                    lines = s.aiter_lines()
                    while not (await lines.__anext__()).startswith("data:"):
                        pass
                    whole = {"prompt": "x", "max_tokens": 4}
                    queued = asyncio.create_task(
                        http.post(f"{g.url}/v1/completions", json=whole, headers={"X-Client-Id": "queued"})
                    )
                    later = asyncio.create_task(
                        http.post(f"{g.url}/v1/completions", json=whole, headers={"X-Client-Id": "b"})
                    )
                    while g.per("client_waiting").get("queued") != 1 or g.per("client_waiting").get("b") != 1:
                        await asyncio.sleep(0.01)
                    queued.cancel()
                    while g.per("client_waiting").get("queued", 0) != 0:
                        await asyncio.sleep(0.01)
                    fake.release.set()
                    async for _ in lines:
                        pass
                return await later

        answer = asyncio.run(scenario())
        m = g.wait_idle()
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    assert m['slora_gateway_requests_total{client="queued",outcome="aborted"}'] == 1
    assert m['slora_gateway_requests_total{client="a",outcome="finished"}'] == 1
    assert m['slora_gateway_requests_total{client="b",outcome="finished"}'] == 1
    assert len(fake.bodies) == 2  # the withdrawn request never reached the upstream
