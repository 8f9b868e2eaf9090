"""The dispatcher without HTTP: schedulers of the registry under a budget of in-flight slots, the
charges of streamed tokens, their reconciliation with usage, and refunds of failed requests.

Expected counters are worked out by hand from the paper's linear cost h(x, y) = x + 2 y, charged
as the engine does: h(x, 0) at dispatch, then 2 for each token after the first."""

import asyncio
import socket

import httpx2
import pytest

from slora_vtc.cost import LinearCost
from slora_vtc.errors import UserError
from slora_vtc.gateway.adapt import Aimd, queue_metrics
from slora_vtc.gateway.api import CHAT, COMPLETIONS
from slora_vtc.gateway.config import GatewayConfig, upstream_base
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.dispatcher import Busy, Dispatcher
from slora_vtc.gateway.metrics import render
from slora_vtc.gateway.monitor import monitor
from slora_vtc.gateway.relay import failed
from slora_vtc.gateway.run import build_context
from slora_vtc.gateway.upstream import Upstream, UpstreamPool
from slora_vtc.sched import SCHEDULERS, build_scheduler
from slora_vtc.serving.clients import ClientConfig, Clients, scheduler_for
from slora_vtc.serving.errors import ApiError

TOKEN_COUNT_SCHEDULERS = [
    "fcfs",
    "passthrough",
    "rpm:100",
    "vtc",
    "lcf",
    "wvtc:1,2",
    "vtc-oracle",
    "vtc-pred:0.5",
    "vtc-avg",
]


def dispatcher(spec: str = "vtc", limits=(1,), max_waiting: int = 100) -> Dispatcher:
    pool = UpstreamPool([Upstream(f"http://u{i}", limit) for i, limit in enumerate(limits)])
    return Dispatcher(build_scheduler(spec, ["a", "b"]), pool, LinearCost(), max_waiting)


def run(scenario):
    return asyncio.run(scenario())


def test_a_count_with_no_fraction_is_an_integer_as_serve_and_vllm_take_it():
    """max_tokens 16.0 reserves 16 tokens a prompt, n 2.0 two choices: 2 prompts x 16 x 2 = 64."""
    routing = COMPLETIONS.route({"prompt": [[1, 2], [3]], "max_tokens": 16.0, "n": 2.0})
    assert routing.max_tokens == 64 and type(routing.max_tokens) is int
    assert CHAT.route({"messages": [], "max_completion_tokens": 7.0}).max_tokens == 7


def test_every_registry_scheduler_is_either_covered_or_refused():
    names = {spec.partition(":")[0] for spec in TOKEN_COUNT_SCHEDULERS}
    assert set(SCHEDULERS) == names | {"lpm", "dlpm"}


@pytest.mark.parametrize("spec", TOKEN_COUNT_SCHEDULERS)
def test_each_token_count_scheduler_dispatches_within_the_slots_and_balances(spec):
    async def scenario():
        d = dispatcher(spec, limits=(1, 2))
        tickets = [d.submit(c, 8, 4) for c in ["a", "b"] * 5]
        assert sum(t.slot.done() for t in tickets) == 3  # three slots in all
        ended = 0
        while ended < len(tickets):
            running = [t for t in tickets if t.slot.done() and not t.request.ended]
            assert 0 < len(running) <= 3
            assert all(u.inflight <= u.limit for u in d.pool.upstreams)
            ticket = running[0]
            d.on_tokens(ticket, 4)
            d.reconcile(ticket, 8, 4)
            d.fail(ticket) if ended % 3 == 2 else d.finish(ticket)
            ended += 1
        assert d.num_waiting == 0 and d.scheduler.num_waiting() == 0 and d.pool.inflight == 0
        outcomes = {o: sum(s.outcomes[o] for s in d.stats.clients.values()) for o in ("finished", "failed")}
        assert outcomes == {"finished": 7, "failed": 3}
        assert all(s.inflight == 0 for s in d.stats.clients.values())
        assert sum(s.service for s in d.stats.clients.values()) == 7 * (8 + 2 * 4)  # failed requests count nothing

    run(scenario)


def test_tokens_are_charged_as_they_arrive_and_usage_corrects_the_estimate():
    async def scenario():
        d = dispatcher("lcf")  # no lift: the counter is exactly what was charged
        t = d.submit("a", 4, 16)  # estimated 4 prompt tokens
        assert d.scheduler.counter_of("a") == 4  # h(4, 0) at dispatch
        d.on_tokens(t)  # the first token is the prefill's: free
        assert d.scheduler.counter_of("a") == 4
        d.on_tokens(t, 2)
        assert d.scheduler.counter_of("a") == 4 + 2 * 2  # charged while the stream runs
        assert d.stats["a"].service == 4 + 2 * 3  # the ledger counts h(x, y) of what was delivered
        d.reconcile(t, 14, 5)  # usage: 14 prompt tokens, 5 generated (two without a chunk of their own)
        assert d.scheduler.counter_of("a") == 14 + 2 * 4
        assert d.stats["a"].service == 14 + 2 * 5
        d.finish(t)
        assert d.scheduler.counter_of("a") == 22 and d.pool.inflight == 0

    run(scenario)


def test_a_failed_request_is_refunded_everything_a_client_that_leaves_keeps_its_charges():
    async def scenario():
        d = dispatcher("lcf")
        failed = d.submit("a", 10, 8)
        d.on_tokens(failed, 3)
        d.fail(failed)
        assert d.scheduler.counter_of("a") == 0 and d.stats["a"].service == 0
        gone = d.submit("a", 10, 8)
        d.on_tokens(gone, 3)
        d.abort(gone)
        assert d.scheduler.counter_of("a") == 10 + 2 * 2 and d.stats["a"].service == 10 + 2 * 3
        assert d.stats["a"].outcomes == {"failed": 1, "aborted": 1}

    run(scenario)


def test_a_predicting_vtc_is_refunded_its_prediction_when_the_request_fails():
    async def scenario():
        d = dispatcher("vtc-oracle")
        t = d.submit("a", 10, 8)
        assert d.scheduler.counter_of("a") == 10 + 2 * 8  # the oracle charges max_tokens up front
        d.on_tokens(t, 2)
        d.fail(t)
        assert d.scheduler.counter_of("a") == 0

    run(scenario)


def test_waiting_requests_leave_the_queue_when_the_client_leaves():
    async def scenario():
        d = dispatcher("vtc")
        first, second = d.submit("a", 4, 4), d.submit("b", 4, 4)
        assert first.slot.done() and not second.slot.done()
        d.abort(second)
        assert d.num_waiting == 0 and d.scheduler.num_waiting() == 0
        d.finish(first)
        assert not second.slot.done() and d.pool.inflight == 0

    run(scenario)


def test_a_full_queue_and_a_rate_limit_are_refused_with_a_status():
    async def scenario():
        d = dispatcher("fcfs", max_waiting=1)
        d.submit("a", 4, 4), d.submit("a", 4, 4)
        with pytest.raises(Busy) as full:
            d.submit("a", 4, 4)
        assert full.value.status == 503 and d.stats["a"].outcomes["rejected"] == 1
        limited = Dispatcher(
            scheduler_for("vtc", Clients(default=ClientConfig("", rpm=1))),
            UpstreamPool([Upstream("http://u", 1)]),
            LinearCost(),
            10,
        )
        limited.submit("a", 4, 4)
        with pytest.raises(Busy) as rate:
            limited.submit("a", 4, 4)
        assert rate.value.status == 429 and limited.stats["a"].outcomes["rejected"] == 1

    run(scenario)


def test_past_max_waiting_only_a_client_under_its_share_is_taken():
    """max_waiting 2, one slot: a's first runs, its next two wait (the bound). b holds 0 < 2 / 2: taken;
    then 3 wait, below twice the bound, but a holds 2 >= 2 / 2 and b 1 >= 1: both refused."""

    async def scenario():
        d = dispatcher("fcfs", max_waiting=2)
        for _ in range(3):
            d.submit("a", 4, 4)
        d.submit("b", 4, 4)
        for client in "ab":
            with pytest.raises(Busy):
                d.submit(client, 4, 4)
        assert d.num_waiting == 3 and {c: d.stats[c].outcomes["rejected"] for c in "ab"} == {"a": 1, "b": 1}

    run(scenario)


def test_when_every_upstream_is_down_waiting_requests_end_with_503():
    async def scenario():
        d = dispatcher("vtc")
        running, waiting = d.submit("a", 4, 4), d.submit("b", 4, 4)
        d.pool.upstreams[0].up = False
        d.fail_waiting(Busy(503, "no upstream is available"))
        with pytest.raises(Busy):
            waiting.slot.result()
        with pytest.raises(Busy):
            d.submit("a", 4, 4)
        d.fail(running)
        assert d.num_waiting == 0 and d.scheduler.num_waiting() == 0 and d.pool.inflight == 0

    run(scenario)


def test_a_connect_timeout_fails_its_request_only_a_refused_connect_ends_the_waiting_ones():
    """With the only upstream marked down, a refused connection (nothing listens) ends the waiting
    requests at once (503); a connect that timed out is a 504 for its own request and leaves the
    waiting ones queued for the next probe round's verdict."""

    async def scenario():
        for error, status, waiting_ends in (
            (httpx2.ConnectError("refused"), 502, True),
            (httpx2.ConnectTimeout("timed out"), 504, False),
        ):
            d = dispatcher("vtc")
            ctx = GatewayContext(GatewayConfig(upstreams=("http://u0",)), Clients(), d.pool, d)
            sent, waiting = d.submit("a", 4, 4), d.submit("b", 4, 4)
            assert failed(ctx, sent, error).status == status
            assert not d.pool.upstreams[0].up and waiting.slot.done() is waiting_ends
            ctx.fail_waiting_if_none_up()  # what every probe round ends with
            with pytest.raises(Busy) as refused:
                waiting.slot.result()
            assert refused.value.status == 503
            assert d.num_waiting == 0 and d.scheduler.num_waiting() == 0 and d.pool.inflight == 0

    run(scenario)


@pytest.mark.parametrize("error", [httpx2.ConnectError("refused"), httpx2.ConnectTimeout("timed out")])
def test_a_request_whose_connection_was_never_made_moves_to_an_upstream_that_answers(error):
    """Neither a refused connect nor one that timed out sent the request: it goes to the other
    upstream (which answers 200) instead of failing, and the first one is marked down and counted."""
    from slora_vtc.gateway.proxy import _send

    async def scenario():
        d = dispatcher("vtc", limits=(1, 1))
        ctx = GatewayContext(GatewayConfig(upstreams=("http://u0", "http://u1")), Clients(), d.pool, d)
        ticket = d.submit("a", 4, 4)
        first = ticket.upstream
        asked = []

        def answer(request: httpx2.Request) -> httpx2.Response:
            asked.append(f"http://{request.url.host}")
            if asked[-1] == first.url:
                raise error
            return httpx2.Response(200, text="data: [DONE]\n\n")

        async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as ctx.http:
            reply = await _send(ctx, ticket, "/v1/completions", b"{}", {})
        other = next(u for u in d.pool.upstreams if u is not first)
        assert reply.status_code == 200 and asked == [first.url, other.url] and ticket.upstream is other
        assert (
            not first.up
            and other.up
            and (first.errors, first.timeouts) == ((1, 0) if isinstance(error, httpx2.ConnectError) else (0, 1))
        )
        assert (first.inflight, other.inflight) == (0, 1)
        d.finish(ticket)
        assert d.pool.inflight == 0

    run(scenario)


@pytest.mark.parametrize("status, out_of_service", [(503, True), (500, False)])
def test_an_upstream_answering_503_is_sent_nothing_until_its_health_answers(status, out_of_service):
    """A 503 (stopping, or full) takes its upstream out of service, so that the queue does not
    pour into it; a probe brings it back once /health answers 200, not while it answers 503. Any
    other 5xx fails its own request only. Either way the request is a 502, refunded."""
    from slora_vtc.gateway.monitor import probe
    from slora_vtc.gateway.proxy import _refused

    async def scenario():
        d = dispatcher("vtc", limits=(1, 1))
        ctx = GatewayContext(GatewayConfig(upstreams=("http://u0", "http://u1")), Clients(), d.pool, d)
        ticket = d.submit("a", 4, 4)
        sick = ticket.upstream
        with pytest.raises(ApiError) as answer:
            await _refused(ctx, ticket, httpx2.Response(status, json={"error": {"message": "stopping"}}))
        assert answer.value.status == 502 and "stopping" in answer.value.message
        assert sick.up is not out_of_service and sick.errors == 1 and d.pool.inflight == 0
        health = [503, 200]
        transport = httpx2.MockTransport(lambda request: httpx2.Response(health.pop(0) if out_of_service else 200))
        async with httpx2.AsyncClient(transport=transport) as ctx.http:
            await probe(ctx, sick, Aimd())
            assert sick.up is not out_of_service
            await probe(ctx, sick, Aimd())
            assert sick.up

    run(scenario)


def test_a_probe_round_that_finds_no_upstream_up_ends_the_waiting_requests():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"

    async def scenario():
        d = Dispatcher(build_scheduler("vtc", ["a", "b"]), UpstreamPool([Upstream(url, 1)]), LinearCost(), 100)
        config = GatewayConfig(upstreams=(url,), probe_interval_s=0.01, connect_timeout_s=1.0)
        ctx = GatewayContext(config, Clients(), d.pool, d)
        sent, waiting = d.submit("a", 4, 4), d.submit("b", 4, 4)
        d.pool.upstreams[0].up = False  # as after a connect that timed out
        async with httpx2.AsyncClient() as ctx.http:
            probes = asyncio.ensure_future(monitor(ctx))
            try:
                with pytest.raises(Busy):
                    await asyncio.wait_for(asyncio.shield(waiting.slot), 10)
            finally:
                probes.cancel()
        d.fail(sent)
        assert d.num_waiting == 0 and d.pool.inflight == 0

    run(scenario)


# -- the adaptive budget ---------------------------------------------------------------------
VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
"""


def test_vllm_queue_metrics_are_summed_over_engines_and_absent_elsewhere():
    assert queue_metrics(VLLM_METRICS) == (2.0, 8.0)
    assert queue_metrics("# TYPE slora_pool_tokens gauge\nslora_pool_tokens 10.0\n") is None
    assert queue_metrics("<html>not metrics</html>") is None


def test_vllm_queue_metrics_ignore_the_rest_of_the_page():
    """Only the two gauges count: not a family whose name starts with theirs, nor histograms around them."""
    page = (
        "# HELP vllm:e2e_request_latency_seconds Latency.\n# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 4.0\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 9.0\n'
        'vllm:e2e_request_latency_seconds_count{model_name="m"} 9.0\n'
        'vllm:e2e_request_latency_seconds_sum{model_name="m"} 12.5\n'
        "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 7.0\n'
    )
    assert queue_metrics(page + VLLM_METRICS) == (2.0, 8.0)
    assert queue_metrics(VLLM_METRICS + page) == (2.0, 8.0)
    assert queue_metrics(page) is None


def test_aimd_grows_by_one_while_the_upstream_keeps_up_and_shrinks_when_it_queues():
    aimd = Aimd(floor=1, ceiling=10)
    assert aimd.next_limit(8, upstream_waiting=0, inflight=8) == 9  # budget used up, nothing queued: one more
    assert aimd.next_limit(8, upstream_waiting=0, inflight=3) == 8  # not using it: no reason to grow
    assert aimd.next_limit(8, upstream_waiting=4, inflight=8) == 6  # queueing upstream: floor(8 * 0.75)
    assert aimd.next_limit(1, upstream_waiting=4, inflight=1) == 1
    assert aimd.next_limit(10, upstream_waiting=0, inflight=10) == 10


# -- configuration -----------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["localhost:8000", "ftp://x", "http://", "not a url"])
def test_an_upstream_that_is_not_a_url_is_named(url):
    with pytest.raises(UserError, match="is not an http"):
        upstream_base(url)


def test_schedulers_needing_prefixes_are_refused_in_one_line():
    for spec in ("lpm", "dlpm:100"):
        with pytest.raises(UserError, match=f"scheduler '{spec}' needs prompt token ids"):
            build_context(GatewayConfig(upstreams=("http://127.0.0.1:1",), scheduler=spec), probe=False)
    assert upstream_base("http://h:8000/v1/") == "http://h:8000"


def clocked_vtc() -> tuple[Dispatcher, list[float]]:
    """A VTC dispatcher with one slot and a clock the test sets (clock[0])."""
    clock = [0.0]
    return Dispatcher(
        build_scheduler("vtc", []), UpstreamPool([Upstream("http://u", 1)]), LinearCost(), 100, clock=lambda: clock[0]
    ), clock


def test_idle_clients_are_forgotten_and_their_totals_kept_under_other():
    async def scenario():
        d, clock = clocked_vtc()
        t = d.submit("a", 4, 4)
        d.on_tokens(t, 2)
        d.finish(t)
        busy = d.submit("b", 4, 4)
        clock[0] = 5.0
        d.expire(10.0)
        assert set(d.stats.clients) == {"a", "b"}  # a idle for 5 s only
        clock[0] = 11.0
        d.expire(10.0)
        assert set(d.stats.clients) == {"b"} and "a" not in d.scheduler.counters()  # b is in flight: kept
        forgotten = d.stats.labelled()["other"]  # b keeps its label: "other" is what a was counted
        assert forgotten.service == 4 + 2 * 2 and forgotten.outcomes == {"finished": 1}
        ctx = GatewayContext(GatewayConfig(upstreams=("http://u",)), Clients(), d.pool, d)
        rendered = render(ctx).decode()
        assert 'slora_gateway_client_service{client="other"} 8.0' in rendered
        assert 'slora_gateway_requests_total{client="other",outcome="finished"} 1.0' in rendered
        d.finish(busy)
        clock[0] = 30.0
        d.expire(10.0)
        assert d.stats.clients == {}  # (the scheduler forgets what it can: VTC may keep a counter, see VTC.forget)

    run(scenario)


def test_a_client_whose_charge_was_corrected_is_still_forgotten():
    """usage corrects a's prompt estimate (4 -> 6 tokens) with VTC.adjust, which leaves forgetting exact
    while it only raises counters: once a has left the queue at counter 6 + 2 * 1 = 8 and b waits at
    that floor, a's counter goes with it (the lift gives it back)."""

    async def scenario():
        d, clock = clocked_vtc()
        t = d.submit("a", 4, 4)
        d.on_tokens(t, 2)
        d.reconcile(t, 6, 2)
        assert d.scheduler.counter_of("a") == 6 + 2 * 1
        d.finish(t)
        d.submit("b", 4, 4)  # dispatched to the one slot: running at the floor a left
        d.submit("b", 4, 4)  # waits
        clock[0] = 20.0
        d.expire(10.0)
        assert "a" not in d.scheduler.counters() and "a" not in d.scheduler.idle.kept

    run(scenario)


# -- sticky client labels in /metrics ---------------------------------------------------------------
def scrape(d: Dispatcher) -> dict[str, dict[str, float]]:
    """Per family: client -> value of the gateway's service and finished-requests series."""
    ctx = GatewayContext(GatewayConfig(upstreams=("http://u",)), Clients(), d.pool, d)
    lines = render(ctx).decode().splitlines()
    m = {k: float(v) for k, v in (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))}
    service, finished = 'slora_gateway_client_service{client="', 'slora_gateway_requests_total{client="'
    return {
        "service": {k[len(service) : -2]: v for k, v in m.items() if k.startswith(service)},
        "finished": {
            k[len(finished) : -len('",outcome="finished"}')]: v
            for k, v in m.items()
            if k.startswith(finished) and k.endswith('outcome="finished"}')
        },
    }


def test_gateway_labels_are_sticky_every_series_only_grows_and_all_sum_to_the_total():
    """Two labels, one slot, fcfs; a request of 4 prompt tokens and k tokens is served h = 4 + 2 k.
    t=0: a (k=2: 8) and b (k=1: 6) take the two labels as they appear. t=1: c, twice k=3 (20), has none.
    t=2, the first relabelling: in the window c 20, a 8, b 6: c takes b's label, counting from 0 (its
    20 stay in "other", with b's 6). t=3: b 6 more, c 10 more. t=13, ten seconds later: c 30, b 12,
    a 8: b takes a's label from 0, a's 8 go into "other"."""

    async def scenario():
        clock = [0.0]
        d = Dispatcher(
            build_scheduler("fcfs", []),
            UpstreamPool([Upstream("http://u", 1)]),
            LinearCost(),
            100,
            clock=lambda: clock[0],
            max_labels=2,
        )

        def serve(client: str, tokens: int) -> None:
            ticket = d.submit(client, 4, 4)
            d.on_tokens(ticket, tokens)
            d.finish(ticket)

        serve("a", 2), serve("b", 1)
        scrapes = [scrape(d)]
        clock[0] = 1.0
        serve("c", 3), serve("c", 3)
        clock[0] = 2.0
        scrapes.append(scrape(d))
        clock[0] = 3.0
        serve("b", 1), serve("c", 3)
        clock[0] = 4.0
        scrapes.append(scrape(d))
        clock[0] = 13.0
        scrapes.append(scrape(d))
        return scrapes

    scrapes = run(scenario)
    assert [s["service"] for s in scrapes] == [
        {"a": 8, "b": 6, "other": 0},
        {"a": 8, "c": 0, "other": 26},
        {"a": 8, "c": 10, "other": 32},
        {"b": 0, "c": 10, "other": 40},
    ]
    assert [s["finished"] for s in scrapes] == [
        {"a": 1, "b": 1, "other": 0},
        {"a": 1, "c": 0, "other": 3},
        {"a": 1, "c": 1, "other": 4},
        {"b": 0, "c": 1, "other": 5},
    ]
    for family, totals in (("service", [14, 34, 50, 50]), ("finished", [2, 4, 6, 6])):
        assert [sum(s[family].values()) for s in scrapes] == totals  # every series together: the total
        for before, after in zip(scrapes, scrapes[1:]):  # a series that stays never goes down
            assert all(after[family][c] >= v for c, v in before[family].items() if c in after[family])


def test_the_budget_keeps_a_margin_queued_upstream_and_never_cuts_below_the_batch_plus_it():
    aimd = Aimd(floor=1, ceiling=100, margin=1.0)  # a margin of one queued request per request of the batch
    # vLLM runs a full batch of 4: the budget aims at 4 running + 4 queued
    assert aimd.next_limit(12, upstream_waiting=8, inflight=12, batch=4) == 9  # floor(12 * 0.75)
    assert aimd.next_limit(9, upstream_waiting=5, inflight=9, batch=4) == 8  # not below 4 + 4
    assert aimd.next_limit(8, upstream_waiting=5, inflight=8, batch=4) == 8
    assert aimd.next_limit(8, upstream_waiting=4, inflight=8, batch=4) == 8  # at the margin: kept
    assert aimd.next_limit(8, upstream_waiting=3, inflight=8, batch=4) == 9  # below it, all used: grow
    # a queue above the margin never raises the budget
    assert aimd.next_limit(3, upstream_waiting=9, inflight=3, batch=4) == 3
    # the default: a quarter of the batch, at least one request
    default = Aimd()
    assert [default.margin_for(b) for b in (0, 1, 4, 5, 256)] == [1, 1, 1, 2, 64]
    # the old rule cut 5 to 3 on a momentary queue of one behind a batch of 4, below the batch
    assert default.next_limit(5, upstream_waiting=1, inflight=5, batch=4) == 5
    assert default.next_limit(5, upstream_waiting=3, inflight=5, batch=4) == 5  # 4 + 1 at least
    assert default.next_limit(5, upstream_waiting=0, inflight=5, batch=4) == 6
