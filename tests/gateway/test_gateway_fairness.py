"""Two flooding clients through the gateway, in front of two of our own `serve` upstreams with two
in-flight slots each (four in all): "light" keeps 4 requests in flight, "heavy" keeps 8, each
for a fixed number of identical streamed requests.

Service is counted on the client side, from each finished request's usage (h(x, y) = x + 2 y),
up to the moment the first client has all its answers (both are backlogged until then).

- vtc: equal service. Each free slot goes to the client with the smaller counter, and counters
  include the tokens of requests still streaming, so while both are backlogged the counters
  differ by at most about one request's charge; service counted from finished requests differs
  from the counters by at most the four in flight. So the finished service differs by at most
  5 requests of 24; we allow 7 (the first token of each request is free in the counters but not
  in this count): a ratio in [17/24, 24/17] = [0.70, 1.42]. Measured: 1.04 to 1.2.
- fcfs: in arrival order, heavy has 8 of the 12 outstanding requests, so it gets about 2/3 of the
  slots: a ratio near 2 (asserted in [1.5, 3], which the VTC bound excludes). Measured: 1.85 to 2.
"""

import asyncio
import time

import httpx2
import pytest

from tests.helpers.gateway import gateway, upstream

REQUESTS = 24  # each client's
IN_FLIGHT = {"light": 4, "heavy": 8}
PROMPT, OUTPUT = 8, 8
SLOTS_PER_UPSTREAM = 2


@pytest.fixture(scope="module")
def upstreams():
    with upstream(pool_tokens=2000) as first, upstream(pool_tokens=2000) as second:
        yield first.url, second.url


async def _stream(http: httpx2.AsyncClient, url: str, client: str) -> tuple[float, int]:
    body = {
        "prompt": [3] * PROMPT,
        "max_tokens": OUTPUT,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage = None
    async with http.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Client-Id": client}) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: {") and '"usage": {' in line:
                usage = httpx2.Response(200, content=line[6:]).json()["usage"]
    return time.monotonic(), usage["prompt_tokens"] + 2 * usage["completion_tokens"]


async def _flood(
    url: str, in_flight: dict[str, int] = IN_FLIGHT, requests: int = REQUESTS
) -> dict[str, list[tuple[float, int]]]:
    done: dict[str, list[tuple[float, int]]] = {c: [] for c in in_flight}

    async def worker(http, client):
        while sent[client] < requests:
            sent[client] += 1
            done[client].append(await _stream(http, url, client))

    sent = {c: 0 for c in in_flight}
    async with httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=None)) as http:
        workers = []
        for i in range(max(in_flight.values())):  # interleaved, so that arrival order mixes the clients
            for client, k in in_flight.items():
                if i < k:
                    workers.append(asyncio.create_task(worker(http, client)))
                    await asyncio.sleep(0.001)
        await asyncio.gather(*workers)
    return done


def _service_ratio(done: dict[str, list[tuple[float, int]]]) -> float:
    """heavy / light service over the requests finished by the time the first client had all of its."""
    cutoff = min(max(t for t, _ in finished) for finished in done.values())
    service = {c: sum(s for t, s in finished if t <= cutoff) for c, finished in done.items()}
    return service["heavy"] / service["light"]


@pytest.mark.parametrize("scheduler, low, high", [("vtc", 17 / 24, 24 / 17), ("fcfs", 1.5, 3.0)])
@pytest.mark.slow
def test_two_flooding_clients_get_equal_service_under_vtc_and_about_1_to_2_under_fcfs(upstreams, scheduler, low, high):
    with gateway(*upstreams, scheduler=scheduler, max_inflight=SLOTS_PER_UPSTREAM) as gw:
        done = asyncio.run(_flood(gw.url))
        m = gw.wait_idle()
    assert {c: len(f) for c, f in done.items()} == {c: REQUESTS for c in IN_FLIGHT}
    assert low <= _service_ratio(done) <= high
    for client in IN_FLIGHT:  # the gateway's own ledger agrees with what the clients received
        assert m[f'slora_gateway_client_service{{client="{client}"}}'] == REQUESTS * (PROMPT + 2 * OUTPUT)
        assert m[f'slora_gateway_requests_total{{client="{client}",outcome="finished"}}'] == REQUESTS


@pytest.mark.slow
def test_a_client_of_weight_2_gets_twice_the_service_under_vtc(upstreams, tmp_path):
    """Both keep 8 in flight (so that light, needing 2/3 of the four slots, is always backlogged)
    and send 48: heavy should have 24 when light has 48, within the same 7 requests as above:
    a ratio in [17/48, 31/48] = [0.35, 0.65], apart from the equal-service bounds."""
    clients = tmp_path / "clients.toml"
    clients.write_text("[clients.light]\nweight = 2.0\n")
    with gateway(*upstreams, scheduler="vtc", max_inflight=SLOTS_PER_UPSTREAM, clients_file=str(clients)) as gw:
        done = asyncio.run(_flood(gw.url, {"light": 8, "heavy": 8}, requests=48))
        gw.wait_idle()
    assert 17 / 48 <= _service_ratio(done) <= 31 / 48
