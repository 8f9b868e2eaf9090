"""Overload: more streams at once than the server takes. Beyond --max-inflight (requests handled over
HTTP) or --max-waiting (requests queued in the scheduler) a request gets a 503 in OpenAI's shape with
Retry-After; a client over its RPM limit a 429 with Retry-After. Every request is accounted for on
the client side (finished or refused, nothing lost), the counts match /metrics, and the pool is free
afterwards. (benchmarks/http_load.py is the full-size version: 2,000 streams, 5 runs.)"""

import asyncio
import json
import math
import socket

import httpx2
import pytest

from slora_vtc.server.run import backlog_note, server_for
from tests.helpers.files import write
from tests.helpers.server import running_server

CLIENTS, PER_CLIENT = 24, 10
PROMPT, MAX_TOKENS = 4, 60
RUNNING = 8  # the pool holds this many requests at once: the rest wait in the scheduler
POOL = RUNNING * (PROMPT + MAX_TOKENS) + 20
LIMITED, LIMITED_RPM = "limited", 5


def body(k: int) -> dict:
    return {"prompt": [1] + [3 + k] * (PROMPT - 1), "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}


async def one(http: httpx2.AsyncClient, url: str, client: str, k: int) -> tuple[str, str]:
    """(outcome, detail): finished / refused (status and message) / lost (anything else)."""
    try:
        async with http.stream("POST", f"{url}/v1/completions", json=body(k), headers={"X-Client-Id": client}) as r:
            if r.status_code != 200:
                error = json.loads(await r.aread())["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert r.headers["retry-after"] == str(math.ceil(60 / LIMITED_RPM) if r.status_code == 429 else 1)
                return "refused", f"{r.status_code} {error['message']}"
            data = [line[5:].strip() async for line in r.aiter_lines() if line.startswith("data:")]
    except httpx2.HTTPError as e:
        return "lost", repr(e)
    if data[-1] == "[DONE]" and json.loads(data[-2])["choices"][0]["finish_reason"] == "length":
        return "finished", ""
    return "lost", data[-2]


async def flood(url: str, watch=None) -> list[tuple[str, str]]:
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
        watcher = asyncio.create_task(watch(http)) if watch else None
        outcomes = await asyncio.gather(
            *(one(http, url, f"c{i}", k) for k in range(PER_CLIENT) for i in range(CLIENTS))
        )
        if watcher:
            watcher.cancel()
        return outcomes


def totals(m: dict[str, float]) -> dict[str, float]:
    """Requests admitted, and ended by outcome, summed over the clients."""
    n = {"admitted": sum(v for k, v in m.items() if k.startswith("slora_requests_admitted_total{"))}
    for outcome in ("rejected", "finished", "aborted"):
        n[outcome] = sum(
            v for k, v in m.items() if k.startswith("slora_requests_total{") and k.endswith(f'outcome="{outcome}"}}')
        )
    return n


def check_accounting(srv, outcomes: list[tuple[str, str]], rate_limited: int) -> dict[str, float]:
    kinds = [kind for kind, _ in outcomes]
    assert kinds.count("lost") == 0, [d for kind, d in outcomes if kind == "lost"][:3]
    n = totals(srv.wait_idle())
    assert n["admitted"] + n["rejected"] == len(outcomes) + LIMITED_RPM + rate_limited
    assert n["rejected"] == kinds.count("refused") + rate_limited
    assert n["finished"] == kinds.count("finished") + LIMITED_RPM and n["aborted"] == 0
    return n


def rate_limit_check(url: str, extra: int) -> None:
    """LIMITED_RPM requests pass, the next ones get a 429 with Retry-After of 60 / rpm seconds."""
    statuses = []
    for k in range(LIMITED_RPM + extra):
        r = httpx2.post(
            f"{url}/v1/completions",
            json={**body(k), "stream": False, "max_tokens": 2},
            headers={"X-Client-Id": LIMITED},
        )
        statuses.append(r.status_code)
        if r.status_code == 429:
            assert r.headers["retry-after"] == "12" and r.json()["error"]["type"] == "rate_limit_error"
    assert statuses == [200] * LIMITED_RPM + [429] * extra


@pytest.fixture
def clients_file(tmp_path):
    return str(write(tmp_path, "clients.toml", f"[clients.{LIMITED}]\nrpm = {LIMITED_RPM}\n"))


@pytest.mark.slow
def test_beyond_max_inflight_requests_get_503_with_retry_after(clients_file):
    with running_server(pool_tokens=POOL, clients_file=clients_file, max_inflight=30) as srv:
        rate_limit_check(srv.url, 2)
        outcomes = asyncio.run(flood(srv.url))
        check_accounting(srv, outcomes, 2)
    refused = [d for kind, d in outcomes if kind == "refused"]
    assert refused and all(
        d.startswith("503 request refused: 30 requests are in flight (--max-inflight)") for d in refused
    )


@pytest.mark.slow
def test_beyond_max_waiting_requests_get_503_and_the_queue_stays_bounded(clients_file):
    max_waiting = 20
    seen_waiting = []
    with running_server(pool_tokens=POOL, clients_file=clients_file, max_waiting=max_waiting) as srv:
        rate_limit_check(srv.url, 1)

        async def watch(http):  # the scheduler's queue, sampled while the flood runs
            while True:
                text = (await http.get(f"{srv.url}/metrics")).text
                seen_waiting.append(
                    sum(
                        float(line.rsplit(" ", 1)[1])
                        for line in text.splitlines()
                        if line.startswith("slora_client_waiting{")
                    )
                )
                await asyncio.sleep(0.01)

        outcomes = asyncio.run(flood(srv.url, watch))
        check_accounting(srv, outcomes, 1)
    refused = [d for kind, d in outcomes if kind == "refused"]
    assert refused and all(
        d == "503 request refused: too many requests are waiting (--max-waiting); retry later" for d in refused
    )
    assert (
        seen_waiting and max(seen_waiting) <= 2 * max_waiting
    )  # past max_waiting, only clients under their share get in
    finished = sum(kind == "finished" for kind, _ in outcomes)
    assert finished >= max_waiting  # the first arrivals fill the queue at least


# -- the listening socket and idle connections ---------------------------------------------------
def test_uvicorn_gets_the_backlog_and_keep_alive_of_the_config():
    with running_server(pool_tokens=POOL, backlog=321, keep_alive_s=0.2) as srv:
        server = server_for(srv.ctx)
        assert (server.config.backlog, server.config.timeout_keep_alive) == (321, 0.2)
        with socket.create_connection(("127.0.0.1", int(srv.url.rsplit(":", 1)[1])), timeout=10) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while b"}" not in reply:
                reply += conn.recv(4096)
            assert reply.startswith(b"HTTP/1.1 200")
            conn.settimeout(3)  # far longer than 0.2 s, shorter than uvicorn's default of 5 s
            assert conn.recv(4096) == b""  # the idle connection was closed by the server


def test_a_kernel_backlog_below_the_configured_one_is_named(tmp_path):
    cap = tmp_path / "somaxconn"
    cap.write_text("1024\n")
    note = backlog_note(4096, cap)
    assert "caps the listen backlog at 1024 (net.core.somaxconn), below --backlog 4096" in note
    assert backlog_note(1024, cap) is None
    assert backlog_note(4096, tmp_path / "absent") is None


def test_a_refusal_comes_before_parsing_and_leaves_the_connection_usable():
    """Beyond --max-inflight a request is refused before it is parsed (a prompt that would be a 400 gets the
    503), and its keep-alive connection carries the next request."""
    with running_server(pool_tokens=4000, max_inflight=1) as srv:
        long = {"inputs": [1, 2], "parameters": {"max_new_tokens": 3000, "ignore_eos": True}}  # an event per token
        with httpx2.stream("POST", f"{srv.url}/generate_stream", json=long, timeout=60) as held:  # holds the one slot
            assert held.status_code == 200
            lines = held.iter_lines()  # kept: a dropped iterator would close the stream
            next(lines)
            with httpx2.Client(timeout=30) as http:
                refused = http.post(f"{srv.url}/v1/completions", json={"prompt": [1] * 5000, "max_tokens": 2})
                assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
                assert http.get(f"{srv.url}/health").status_code == 200
        srv.wait_idle()


def test_a_full_queue_refuses_the_flooding_client_and_takes_the_others():
    """max_waiting 4, one request running at a time (each far longer than the test). Flooder A fills the
    queue: its 6th request (1 running, 4 waiting) is refused. Past the bound a client is taken while it
    holds less than max_waiting / (waiting clients): B's first two are taken (0 and 1 < 4 / 2), its
    third is refused (2 >= 2); A stays refused. Closing the streams aborts the 7 taken."""
    long = {"prompt": [1, 2, 3], "max_tokens": 3000, "stream": True, "ignore_eos": True}
    statuses: dict[str, list[int]] = {"A": [], "B": []}
    with running_server(pool_tokens=3 + 3000 + 20, max_waiting=4) as srv:

        async def run():
            async with httpx2.AsyncClient(timeout=120) as http:
                held = []
                for client in ["A"] * 6 + ["B"] * 3 + ["A"]:  # one at a time: each is queued before the next is sent
                    r = await http.send(
                        http.build_request(
                            "POST", f"{srv.url}/v1/completions", json=long, headers={"X-Client-Id": client}
                        ),
                        stream=True,
                    )
                    statuses[client].append(r.status_code)
                    held.append(r)
                for r in held:
                    await r.aclose()

        asyncio.run(run())
        n = totals(srv.wait_idle())
    assert statuses == {"A": [200] * 5 + [503, 503], "B": [200, 200, 503]}
    assert (n["admitted"], n["rejected"], n["aborted"]) == (7, 3, 7)
