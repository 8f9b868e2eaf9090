"""The fair gateway on real vLLM (issue 19, item 4): `slora-vtc gateway` as a subprocess of our own
venv (`SLORA_VTC_MAIN_PYTHON`, which `make test-vllm` sets) in front of the vLLM servers conftest.py
starts once per session, loaded through the `openai` client (load.py).

Expected values, worked out by hand: every request has the same prompt and output length, so a
tenant's service is proportional to the tokens it receives. Two tenants keeping 24 and 8 requests in
flight get about 3 : 1 from vLLM alone (FCFS: each holds its share of the queue); through the gateway
under VTC, or through the gateway passing through to the plugin's VTC (the light tenant then keeps
16 in flight), 1 : 1 (asserted within [0.8, 1.25]). The gateway's ledger counts h(x, y) = x + 2 y
per finished request from its `usage`, and refunds every request that failed.
"""

import asyncio
import json
import os
import random
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.vllm import load
from tests.vllm.load import OUTPUT, PROMPT, RUN_S, WINDOW, Sampler, assert_backlogged, run, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MAIN_PYTHON = os.environ.get("SLORA_VTC_MAIN_PYTHON")
START_TIMEOUT_S = 60.0
BATCH = 4  # conftest's --max-num-seqs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    def __init__(self, url: str, process: subprocess.Popen, log: Path):
        self.url, self.process, self.log = url, process, log

    def log_tail(self, lines: int = 40) -> str:
        """The end of what the gateway printed (its start line, uvicorn's errors), for a failure's message."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> dict[str, float]:
        page = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            sample.name + _labels(sample.labels): sample.value
            for family in text_string_to_metric_families(page)
            for sample in family.samples
        }

    def total(self, name: str) -> float:
        """A family's samples summed (its "other" series too)."""
        return sum(v for k, v in self.metrics().items() if k == name or k.startswith(name + "{"))


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""


@contextmanager
def gateway(upstream: str, *args: str):
    """`slora-vtc gateway` in front of `upstream`, run by our own venv's python; what it prints goes to
    a file (a pipe nobody reads would fill and stall it), which a failing test shows."""
    if not MAIN_PYTHON:
        pytest.skip("SLORA_VTC_MAIN_PYTHON (our .venv's python, with the serving requirements) is not set")
    port = free_port()
    command = [MAIN_PYTHON, "-m", "slora_vtc", "gateway", "--upstream", upstream, "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = Path(tempfile.mkstemp(prefix="gateway-", suffix=".log")[1])
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "--log-level", "warning", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,  # in this session, not one of its own: tests/vllm/server.py says why
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the gateway exited: {log.read_text(errors='replace')}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("the gateway did not answer within 60 s")
            time.sleep(0.2)
        yield Gateway(url, process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# A connection reset before any of the answer came was the gateway closing an idle connection (uvicorn's
# keep-alive, then 5 s) just as the client, whose pool keeps idle connections 5 s too, sent a request on it
# (docs/gateway.md, Limits): the gateway now keeps them longer. Resets are counted apart from other errors
# so that a failure says which it was.


def service_ratio(g: Gateway, in_flight: dict[str, int]) -> float:
    ratio, served = load.service_ratio(g.url, in_flight, RUN_S, WINDOW, PROMPT, OUTPUT)
    for tenant, s in served.items():
        assert not s.errors, f"{tenant}: {s.errors[:3]}; the gateway printed:\n{g.log_tail()}"
    resets = [r for s in served.values() for r in s.resets]
    assert not resets, f"{len(resets)} connections reset before any answer: {resets[:3]}"
    return ratio


def vllm_gauges(url: str) -> dict[str, float]:
    page = httpx.get(f"{url}/metrics", timeout=10).text
    out = {"waiting": 0.0, "running": 0.0}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_waiting":
                out["waiting"] += sample.value
            elif sample.name == "vllm:num_requests_running":
                out["running"] += sample.value
    return out


# -- the gateway's own VTC in front of vLLM as shipped -------------------------------------------


def test_vtc_in_the_gateway_serves_backlogged_tenants_equally_with_a_budget_from_vllms_metrics(stock_vllm):
    with gateway(stock_vllm.url, "--scheduler", "vtc") as g:
        limit = f'slora_gateway_upstream_limit{{upstream="{stock_vllm.url}"}}'
        with Sampler(lambda: {**vllm_gauges(stock_vllm.url), **g.metrics()}) as sampled:
            ratio = service_ratio(g, {"heavy": 24, "light": 8})
        assert 0.8 <= ratio <= 1.25
        loaded = [row for row in sampled.values if row["slora_gateway_waiting"] >= 10]  # the backlog is in the gateway
        assert len(loaded) > 20
        # the budget follows vLLM's real queue: a batch of 4 running and at most about a batch queued behind it
        # (the margin), never below the batch; vLLM alone would hold all 32 requests
        assert all(BATCH <= row[limit] <= 3 * BATCH for row in loaded)
        assert max(row["waiting"] for row in loaded) <= 2 * BATCH
        assert g.metrics()["slora_gateway_waiting"] == 0  # the load's end: what waited was withdrawn
    start_line = g.log.read_text().splitlines()[0]
    assert "adaptive from 8 in flight" in start_line, start_line


class Relay:
    """A TCP relay in front of vLLM. `cut()` is vLLM dying as the gateway sees it: every open connection
    reset, nothing listening any more (the shared vLLM itself lives on for the other tests)."""

    def __init__(self, target: str):
        self.target_port = int(target.rsplit(":", 1)[1])
        self.loop = asyncio.new_event_loop()
        self.writers: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._call(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    async def _handle(self, reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def cut(self):
        async def cut():
            self.server.close()
            for writer in self.writers:
                writer.transport.abort()

        self._call(cut())

    def close(self):
        self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


async def _ask(http: httpx.AsyncClient, url: str, tenant: str, stream: bool, rng: random.Random) -> dict:
    """One request through the gateway, and how it ended for its client."""
    body = {
        "model": "tiny",
        "prompt": [rng.randrange(3, 250) for _ in range(PROMPT)],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    outcome = {"tenant": tenant, "tokens": 0, "usage": None, "error": None, "done": False}
    async with http.stream("POST", f"{url}/v1/completions", json=body, headers={"X-Client-Id": tenant}) as reply:
        if reply.status_code != 200:
            outcome["error"] = (reply.status_code, json.loads(await reply.aread())["error"])
            return outcome
        if not stream:
            answer = json.loads(await reply.aread())
            outcome["usage"], outcome["done"] = answer["usage"], True
            return outcome
        async for line in reply.aiter_lines():
            if line == "data: [DONE]":
                outcome["done"] = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    outcome["error"] = (200, event["error"])
                elif event.get("usage"):
                    outcome["usage"] = event["usage"]
                elif event.get("choices"):
                    outcome["tokens"] += 1
    return outcome


def test_nothing_is_lost_when_vllm_dies_mid_run(stock_vllm):
    relay = Relay(stock_vllm.url)
    try:
        with gateway(relay.url, "--scheduler", "vtc", "--upstream-timeout", "30") as g:

            async def load():
                rng = random.Random(7)
                async with httpx.AsyncClient(timeout=120) as http:
                    tasks = [
                        asyncio.create_task(_ask(http, g.url, tenant, stream=i % 4 != 3, rng=rng))
                        for i in range(10)
                        for tenant in ("heavy", "light")
                    ]
                    # vLLM streams (the prompts of the 8 dispatched first count 8 * 32), and the gateway holds a
                    # backlog, when it dies
                    while (
                        g.total("slora_gateway_client_service") < 8 * PROMPT + 100
                        or g.metrics()["slora_gateway_waiting"] < 2
                    ):
                        await asyncio.sleep(0.2)
                    await asyncio.to_thread(relay.cut)
                    # the requests that waited found no upstream: the gateway knows that none is left
                    await asyncio.to_thread(wait_until, lambda: httpx.get(f"{g.url}/health").status_code != 200)
                    late = [asyncio.create_task(_ask(http, g.url, "late", True, rng)) for _ in range(2)]
                    return await asyncio.wait_for(asyncio.gather(*tasks, *late), timeout=120)

            outcomes = run(load())
            metrics = wait_until(lambda: (m := g.metrics())["slora_gateway_waiting"] == 0 and m)
            assert g.total("slora_gateway_upstream_inflight") == 0 and g.total("slora_gateway_client_inflight") == 0
            complete = [o for o in outcomes if o["done"] and o["error"] is None]
            failed = [o for o in outcomes if o["error"] is not None]
            assert len(complete) + len(failed) == len(outcomes) == 22  # every request ended, one way or the other
            assert failed, "vLLM died and no request noticed"
            for status, error in (o["error"] for o in failed):  # OpenAI's error shape, and a status that says so
                assert status in (200, 502, 503, 504) and {"message", "type"} <= set(error), error
            assert all(o["error"][0] == 503 for o in failed if o["tenant"] == "late")  # no upstream left
            outcomes_counted = {
                outcome: sum(v for k, v in metrics.items() if k.startswith("slora_gateway_requests_total") and
                             f'outcome="{outcome}"' in k)
                for outcome in ("finished", "failed", "rejected", "aborted")
            }  # fmt: skip
            assert outcomes_counted["finished"] == len(complete)
            assert outcomes_counted["failed"] + outcomes_counted["rejected"] == len(failed)
            assert outcomes_counted["aborted"] == 0
            # failed requests were refunded: the ledger holds exactly the finished requests' h(x, y)
            for tenant in ("heavy", "light", "late"):
                expected = sum(
                    o["usage"]["prompt_tokens"] + 2 * o["usage"]["completion_tokens"]
                    for o in complete
                    if o["tenant"] == tenant
                )
                assert metrics.get(f'slora_gateway_client_service{{client="{tenant}"}}', 0) == expected
            assert httpx.get(f"{g.url}/health", timeout=10).status_code != 200  # it says that no upstream is up
    finally:
        relay.close()


# -- the plugin inside vLLM, the gateway passing through -------------------------------------------
def test_passthrough_leaves_the_order_to_the_plugin_and_counts_service(fair_vllm):
    """The light tenant keeps 16 in flight: with 8, the gateway's hop kept it out of vLLM part of the
    time (nothing of it waiting in vLLM in 8 of 52 samples of one run; 1.51 in another), and the plugin
    cannot order what is not in vLLM's queue."""
    with gateway(fair_vllm.url, "--scheduler", "passthrough") as g:
        # twice a second, not five times: each sample parses vLLM's /metrics page in this process, beside the
        # load's client, whose lag on two cores is what takes the light tenant out of vLLM's queue
        with Sampler(lambda: {**vllm_gauges(fair_vllm.url), **g.metrics()}, every_s=0.5) as sampled:
            with Sampler(fair_vllm.stats, every_s=0.5) as stats:
                start = time.monotonic()
                ratio = service_ratio(g, {"heavy": 24, "light": 16})
        assert_backlogged(stats.between(start + WINDOW[0], start + WINDOW[1]), ["heavy", "light"])
        assert 0.8 <= ratio <= 1.25  # the plugin's VTC: vLLM alone gives about 3
        loaded = [
            row for row in sampled.values if row["waiting"] >= 10
        ]  # the backlog is in vLLM, where the plugin orders it
        assert len(loaded) > 20
        assert all(row["slora_gateway_waiting"] == 0 for row in sampled.values)  # the gateway holds nothing back
        m = g.metrics()
        assert (
            m['slora_gateway_client_service{client="heavy"}'] > 0
            and m['slora_gateway_client_service{client="light"}'] > 0
        )
    stats = wait_until(lambda: (s := fair_vllm.stats()) and {"heavy", "light"} <= set(s["tenants"]) and s)
    assert stats["tenants"]["heavy"]["finished"] > 0 and stats["tenants"]["light"]["finished"] > 0


def test_the_tenant_the_gateway_authenticated_reaches_the_plugin_in_vllm_xargs(fair_vllm, tmp_path):
    """The body names another tenant in vllm_xargs and another X-Client-Id; the client's key says who it
    is: the plugin (whose middleware keeps a tenant the body names) charges the key's client."""
    clients = tmp_path / "clients.toml"
    clients.write_text('[clients.keyed]\napi_key = "sk-keyed"\n')
    with gateway(fair_vllm.url, "--scheduler", "passthrough", "--clients", str(clients)) as g:
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 3, "vllm_xargs": {"tenant": "claimed"}}
        headers = {"Authorization": "Bearer sk-keyed", "X-Client-Id": "claimed"}
        answer = httpx.post(f"{g.url}/v1/completions", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3
    stats = wait_until(lambda: (s := fair_vllm.stats()) and "keyed" in s["tenants"] and s)
    assert stats["tenants"]["keyed"]["finished"] == 1
    assert "claimed" not in stats["tenants"]
