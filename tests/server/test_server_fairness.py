"""Two clients flood a saturated server: under VTC their service stays within the paper's bound
(Theorem 4.4) while both are backlogged; under FCFS the one that sends more dominates.

Service as the paper counts it (w_p = 1 per prompt token at prefill, w_q = 2 per output token),
read from /metrics, which the engine thread answers between two steps: a consistent snapshot.
"""

import asyncio
import threading

import httpx2
import pytest

from tests.helpers.server import running_server

POOL = 300  # about 4 requests at a time: saturated from the first arrivals on
PROMPT, OUTPUT = 8, 64
HEAVY, LIGHT = 60, 20  # requests each sends; heavy sends 3 for each of light's
W_P, W_Q = 1, 2
BOUND = 2 * max(W_P * PROMPT, W_Q * POOL)  # 2 max(w_p L_input, w_q M), M = pool tokens


def flood(url: str) -> list[tuple[float, float]]:
    """Send the interleaved flood; return (heavy, light) service at every snapshot in which both
    clients had requests waiting."""
    samples, done = [], threading.Event()

    async def send(http: httpx2.AsyncClient, client: str) -> None:
        body = {"inputs": [3] * PROMPT, "parameters": {"max_new_tokens": OUTPUT, "ignore_eos": True}}
        r = await http.post(f"{url}/generate", json=body, headers={"X-Client-Id": client})
        assert r.status_code == 200

    async def main() -> None:
        async with httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=None)) as http:
            order = (["heavy"] * 3 + ["light"]) * LIGHT
            tasks = []
            for client in order:
                tasks.append(asyncio.create_task(send(http, client)))
                await asyncio.sleep(0.002)  # arrive in this order
            await asyncio.gather(*tasks)
        done.set()

    def watch() -> None:
        with httpx2.Client(timeout=10) as http:
            while not done.is_set():
                samples.append(_sample(http.get(f"{url}/metrics").text))

    watcher = threading.Thread(target=watch)
    watcher.start()
    asyncio.run(main())
    watcher.join()
    return [(s["heavy"], s["light"]) for s in samples if s["waiting"] == {"heavy", "light"}]


def _sample(text: str) -> dict:
    service = {"heavy": 0.0, "light": 0.0}
    waiting = set()
    for line in text.splitlines():
        for client in service:
            if f'{{client="{client}"}}' not in line:
                continue
            value = float(line.rsplit(" ", 1)[1])
            if line.startswith("slora_served_input_tokens_total"):
                service[client] += W_P * value
            elif line.startswith("slora_served_output_tokens_total"):
                service[client] += W_Q * value
            elif line.startswith("slora_client_waiting") and value > 0:
                waiting.add(client)
    return {**service, "waiting": waiting}


@pytest.mark.parametrize("scheduler", ["vtc", "fcfs"])
@pytest.mark.slow
def test_flood(scheduler):
    with running_server(pool_tokens=POOL, scheduler=scheduler) as srv:
        backlogged = flood(srv.url)
        srv.wait_idle()
    assert len(backlogged) >= 5, "the watcher saw too few moments with both clients backlogged"
    heavy, light = backlogged[-1]
    if scheduler == "vtc":
        assert max(abs(h - lt) for h, lt in backlogged) <= BOUND
    else:
        assert heavy - light > BOUND  # beyond what VTC guarantees
        assert heavy > 2 * light
