"""Per-tenant metrics: bounded client labels, idle clients forgotten with totals kept, latency
histograms, finish reasons, Jain's index, HTTP statuses, build and process info, the metrics key."""

import asyncio
import math
import time

import httpx2
import pytest

from slora_vtc.backends.sim import SimBackend, StepTimeModel
from slora_vtc.clock import VirtualClock
from slora_vtc.request import Request
from slora_vtc.sched import VTC
from slora_vtc.server.events import Ended, Subscriber
from slora_vtc.server.metrics import BuildInfo, render
from slora_vtc.server.service import EngineService
from slora_vtc.server.stats import ServerStats
from slora_vtc.serving.ledger import RELABEL_S
from slora_vtc.serving.window import ServiceWindow
from tests.helpers.engine import make_engine
from tests.helpers.server import parse_metrics, running_server

BUILD = BuildInfo("0", "vtc", "sim")


def series(values: dict[str, float], name: str, **labels: str) -> dict[str, float]:
    """client -> value of the series `name{client="...",LABELS}` (the other labels as given, in their order)."""
    prefix, suffix = f'{name}{{client="', '"' + "".join(f',{k}="{v}"' for k, v in labels.items()) + "}"
    clients = {
        k[len(prefix) : -len(suffix)]: v for k, v in values.items() if k.startswith(prefix) and k.endswith(suffix)
    }
    return {client: v for client, v in clients.items() if '"' not in client}


# -- the engine service on simulated time: every number worked out by hand ---------------------------
PREFILL_S, DECODE_S = 0.4, 0.2


def sim_service(pool: int, **settings) -> tuple[EngineService, VirtualClock]:
    clock = VirtualClock()
    model = StepTimeModel(prefill_coef=(PREFILL_S, 0.0, 0.0), decode_coef=(DECODE_S, 0.0, 0.0))
    engine = make_engine(VTC(), SimBackend(model), clock=clock, pool_tokens=pool)
    return EngineService(engine, **settings), clock


def serve_all(service: EngineService, requests: list[Request]) -> list[Ended]:
    async def scenario():
        loop, queues = asyncio.get_running_loop(), [asyncio.Queue() for _ in requests]
        for req, q in zip(requests, queues):
            service.submit(req, Subscriber(loop, q))
        ends = []
        for q in queues:
            while not isinstance(event := await asyncio.wait_for(q.get(), 60), Ended):
                pass
            ends.append(event)
        return ends

    return asyncio.run(scenario())


def scrape(service: EngineService) -> dict[str, float]:
    return parse_metrics(render(service.snapshot().result(timeout=30), BUILD, {}).decode())


def test_latency_histograms_counters_shares_and_jain_by_hand():
    # a: 2 + 3 tokens (5 slots), b: 4 + 3 (7 slots); a pool of 10 holds one at a time, so b waits for a.
    # a: admitted at 0, first token 0.4, then 0.6, 0.8 (ends). b: admitted 0.8, tokens 1.2, 1.4, 1.6 (ends).
    service, _ = sim_service(pool=10)
    service.start()
    ends = serve_all(
        service, [Request("a", 2, 3, 0.0, prompt_ids=[1, 2]), Request("b", 4, 3, 0.0, prompt_ids=[1, 2, 3, 4])]
    )
    m = scrape(service)
    service.shutdown()
    assert [e.finish_reason for e in ends] == ["length", "length"]
    hist = "slora_time_to_first_token_seconds"
    assert m[f'{hist}_bucket{{client="a",le="0.25"}}'] == 0 and m[f'{hist}_bucket{{client="a",le="0.5"}}'] == 1
    assert m[f'{hist}_bucket{{client="b",le="1.0"}}'] == 0 and m[f'{hist}_bucket{{client="b",le="2.5"}}'] == 1
    assert m[f'{hist}_sum{{client="a"}}'] == pytest.approx(0.4) and m[f'{hist}_sum{{client="b"}}'] == pytest.approx(1.2)
    assert m['slora_queue_time_seconds_sum{client="a"}'] == 0 and m[
        'slora_queue_time_seconds_sum{client="b"}'
    ] == pytest.approx(0.8)
    assert m['slora_e2e_request_latency_seconds_sum{client="a"}'] == pytest.approx(0.8)
    assert m['slora_e2e_request_latency_seconds_sum{client="b"}'] == pytest.approx(1.6)
    gap = "slora_inter_token_latency_seconds"
    assert m[f'{gap}_count{{client="a"}}'] == 2 and m[f'{gap}_sum{{client="a"}}'] == pytest.approx(2 * DECODE_S)
    assert m[f'{gap}_bucket{{client="a",le="0.1"}}'] == 0 and m[f'{gap}_bucket{{client="a",le="0.25"}}'] == 2
    assert m['slora_requests_by_finish_reason_total{client="a",reason="length"}'] == 1
    assert m['slora_requests_by_finish_reason_total{client="a",reason="stop"}'] == 0
    # VTC: a pays 2 at admission and 2 per decode token (the first token is free): 2 + 2 + 2; b: 4 + 2 + 2
    assert series(m, "slora_client_counter") == {"a": 6.0, "b": 8.0}
    assert series(m, "slora_client_weight") == {"a": 1.0, "b": 1.0}
    # service x + 2y: a 2 + 6 = 8, b 4 + 6 = 10 of 18; Jain: 18^2 / (2 (8^2 + 10^2)) = 324 / 328
    assert series(m, "slora_client_service_share") == pytest.approx({"a": 8 / 18, "b": 10 / 18, "other": 0.0})
    assert m["slora_jain_index"] == pytest.approx(324 / 328)
    assert m["slora_active_clients"] == 2


def test_five_thousand_client_ids_are_bounded_in_labels_and_forgotten_when_idle():
    """The defect: every new client id stayed forever (scheduler, stats, /metrics labels)."""
    service, clock = sim_service(pool=100_000, client_idle_s=600.0, max_client_labels=10)
    service.start()
    ends = serve_all(service, [Request(f"user-{i}", 2, 1, 0.0, prompt_ids=[1, 2]) for i in range(5000)])
    assert {e.finish_reason for e in ends} == {"length"}
    m = scrape(service)
    labelled = series(m, "slora_requests_total", outcome="finished")
    assert len(labelled) == 11 and "other" in labelled  # the first 10 by name, the rest together
    assert sum(labelled.values()) == 5000 and labelled["other"] == 4990
    assert m["slora_known_clients"] == 5000
    service.call(lambda: clock.advance(601.0)).result(timeout=30)  # everyone idle for longer than 600 s
    m = scrape(service)
    assert m["slora_known_clients"] == 0 and m["slora_forgotten_clients_total"] == 5000
    assert series(m, "slora_requests_total", outcome="finished") == {"other": 5000}  # the totals kept
    assert series(m, "slora_served_input_tokens_total") == {"other": 10_000}
    assert m['slora_time_to_first_token_seconds_count{client="other"}'] == 5000
    vtc = service.engine.scheduler
    assert vtc.counters() == {} and vtc.idle.kept == {}  # every counter was at most the floor: none kept
    service.shutdown()


def test_an_idle_client_is_not_forgotten_before_its_time_and_returns_lifted():
    service, clock = sim_service(pool=10, client_idle_s=100.0)
    service.start()
    serve_all(service, [Request("a", 2, 3, 0.0, prompt_ids=[1, 2])])  # a: 6, ends at 0.8
    service.call(lambda: clock.advance(99.0)).result(timeout=30)
    assert scrape(service)["slora_known_clients"] == 1
    service.call(lambda: clock.advance(1.0)).result(timeout=30)
    m = scrape(service)
    assert m["slora_known_clients"] == 0 and series(m, "slora_client_counter") == {}
    serve_all(service, [Request("b", 2, 1, clock.now(), prompt_ids=[1, 2])])  # lifted to a's 6 (the last to leave), + 2
    assert series(scrape(service), "slora_client_counter") == {"b": 8.0}
    service.shutdown()


# -- labels and the window, by hand ----------------------------------------------------------------------
def test_labels_move_to_the_busiest_and_every_series_only_grows():
    stats = ServerStats(max_labels=2)
    for client, tokens in (("a", 1), ("b", 1), ("c", 5)):  # a and b get the two labels; c is "other"
        stats.served(client, tokens, 0, 0, now=0.0)
        stats[client].finished += 1
    shown = stats.labelled()
    assert {c: s.input_tokens for c, s in shown.items()} == {"a": 1, "b": 1, "other": 5}
    stats.served("b", 2, 0, 0, now=1.0)  # b: 3 in the window, a: 1, c: 5
    stats.begin("c")  # c has a request in the server as it gets its label
    stats.relabel(now=RELABEL_S)
    assert set(stats.labels) == {"c", "b"}  # a, the least busy, lost its label to c
    shown = stats.labelled()
    # c counts from its label on (0); a's 1 went back into "other", which keeps c's 5 too: 6
    assert {c: s.input_tokens for c, s in shown.items()} == {"b": 3, "c": 0, "other": 6}
    assert {c: s.finished for c, s in shown.items()} == {"b": 1, "c": 0, "other": 2}
    assert {c: s.live for c, s in shown.items()} == {"b": 0, "c": 1, "other": 0}  # a level: not from the label on
    stats.forget("b")  # b expires: its 3 join "other"
    assert {c: s.input_tokens for c, s in stats.labelled().items()} == {"c": 0, "other": 9}
    assert stats.total.input_tokens == 9 and stats.total.finished == 3


def test_a_client_only_ever_refused_is_forgotten_too_and_the_total_keeps_it():
    clock = VirtualClock()
    stats = ServerStats(max_labels=2, now=clock.now)
    stats["x"].rejected += 1  # refused before it ever had a request in the server (shutdown, overload)
    assert stats.total.rejected == 1 and stats.until_due(600.0) == 600.0
    clock.advance(600.0)
    assert stats.expire(600.0, lambda client, now: True) == ["x"] and "x" not in stats and stats.total.rejected == 1
    assert stats.labelled()["other"].rejected == 1


def test_jain_index_over_the_window_by_hand():
    window = ServiceWindow(window_s=60)
    window.add("a", 10, now=0.5)
    window.add("b", 30, now=1.0)
    window.set_live("c", True)  # waiting, served nothing: active with rate 0
    assert window.active == 3
    assert window.jain() == pytest.approx(40**2 / (3 * (10**2 + 30**2)))  # 1600 / 3000
    window.set_live("c", False)
    assert window.jain() == pytest.approx(40**2 / (2 * 1000))
    window.advance(60.5)  # a's second (0) left the window; b's (1) not yet
    assert window.service == {"b": 30} and window.jain() == 1.0
    window.advance(61.0)
    assert window.active == 0 and math.isnan(window.jain())


# -- over HTTP ----------------------------------------------------------------------------------------------
def complete(url: str, client: str, **body) -> httpx2.Response:
    return httpx2.post(
        f"{url}/v1/completions",
        json={"prompt": "hi there", "max_tokens": 2, **body},
        headers={"X-Client-Id": client},
        timeout=30,
    )


def test_http_statuses_by_route_template_and_build_and_process_info():
    with running_server(max_body_bytes=1000) as server:
        assert complete(server.url, "a").status_code == 200
        assert complete(server.url, "a", max_tokens=-1).status_code == 400
        assert complete(server.url, "a", prompt="x" * 2000).status_code == 413  # refused before routing
        assert httpx2.get(f"{server.url}/no/such/path").status_code == 404
        assert httpx2.get(f"{server.url}/v1/models/nope").status_code == 404
        m = server.wait_idle()
    http = {k: v for k, v in m.items() if k.startswith("slora_http_requests_total")}
    assert http['slora_http_requests_total{route="/v1/completions",status="200"}'] == 1
    assert http['slora_http_requests_total{route="/v1/completions",status="400"}'] == 1
    assert http['slora_http_requests_total{route="/v1/completions",status="413"}'] == 1
    assert http['slora_http_requests_total{route="unmatched",status="404"}'] == 1
    assert http['slora_http_requests_total{route="/v1/models/{model_id:path}",status="404"}'] == 1
    assert m['slora_build_info{model="tiny",scheduler="vtc",version="0.1.0"}'] == 1
    assert m["process_cpu_seconds_total"] > 0 and "process_resident_memory_bytes" in m
    assert any(k.startswith("python_info") for k in m)


def test_clients_over_http_expire_and_labels_stay_bounded():
    with running_server(max_client_labels=3, client_idle_s=0.5) as server:
        for i in range(8):
            assert complete(server.url, f"c{i}").status_code == 200
        m = server.wait_idle()
        finished = server.per_client("requests_total", outcome="finished")
        assert len(finished) <= 4 and "other" in finished  # three by name at most (some may have expired already)
        assert sum(finished.values()) == 8
        deadline = time.monotonic() + 20
        while server.metrics()["slora_known_clients"] and time.monotonic() < deadline:
            time.sleep(0.1)
        m = server.metrics()
        assert server.per_client("requests_total", outcome="finished") == {"other": 8}
    assert m["slora_known_clients"] == 0 and m["slora_forgotten_clients_total"] == 8


def test_metrics_behind_a_key():
    with running_server(metrics_key="s3cret") as server:
        refused = httpx2.get(f"{server.url}/metrics")
        wrong = httpx2.get(f"{server.url}/metrics", headers={"Authorization": "Bearer nope"})
        ok = httpx2.get(f"{server.url}/metrics", headers={"Authorization": "Bearer s3cret"})
    assert refused.status_code == 401 and wrong.status_code == 401
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert ok.status_code == 200 and "slora_pool_tokens" in ok.text


def test_cached_and_uncached_input_tokens_with_the_prefix_cache():
    with running_server(prefix_cache=True) as server:
        first = complete(server.url, "a", prompt="the same long prompt, twice")
        second = complete(server.url, "a", prompt="the same long prompt, twice")
        n = first.json()["usage"]["prompt_tokens"]
        assert second.json()["usage"]["prompt_tokens"] == n
        m = server.metrics()
    # the second prefill reuses all but the last prompt token (one is always computed)
    assert m['slora_served_input_tokens_cached_total{client="a"}'] == n - 1
    assert m['slora_served_input_tokens_uncached_total{client="a"}'] == n + 1
    assert m['slora_served_input_tokens_total{client="a"}'] == 2 * n


def test_serve_has_a_prefix_cache_flag():
    from slora_vtc.cli import build_parser

    assert build_parser().parse_args(["serve", "--prefix-cache"]).prefix_cache is True
    assert build_parser().parse_args(["serve"]).prefix_cache is False
