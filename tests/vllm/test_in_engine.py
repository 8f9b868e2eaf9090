"""The plugin inside vLLM's own scheduler, in this process with a made-up model (engine.py): what it
charges for chunked prompts and tokens, whom it lets vLLM preempt, what an abort or a rate limit
leaves behind. Expected values are worked out by hand from the requests' lengths: the linear cost
x + 2 y, the first token free (it comes with the prefill), so a request of x prompt and y output
tokens is charged x + 2 (y - 1) in all."""

import pytest
from vllm.v1.request import RequestStatus

from slora_vtc.vllm.scheduler import FairAsyncScheduler, FairSyncScheduler
from tests.vllm.engine import Requests, run, scheduler, step


@pytest.fixture
def model(tiny_model):
    return tiny_model


def charged(sched, tenant):
    return sched.fair_snapshot()["tenants"][tenant]["charged"]


def test_a_chunked_prompt_is_charged_chunk_by_chunk_and_the_whole_adds_up(model):
    sched, make = scheduler(model, {"scheduler": "vtc"}, batched=64), Requests().make
    sched.add_request(make("a", 150, 10))
    step(sched)
    assert charged(sched, "a") == 64  # the first chunk: 64 of the 150 prompt tokens
    step(sched)
    assert charged(sched, "a") == 128
    run(sched)
    assert charged(sched, "a") == 150 + 2 * (10 - 1)
    assert sched.fair.counter_of("a") == 150 + 2 * 9
    assert len(sched.tracked) == 0 and sched.fair.num_waiting() == 0


@pytest.mark.parametrize("cls, depth", [(FairAsyncScheduler, 2), (FairSyncScheduler, 1)], ids=["async", "sync"])
def test_tenants_are_charged_what_they_were_served(model, cls, depth):
    sched, make = scheduler(model, {"scheduler": "vtc"}, batched=48, cls=cls), Requests().make
    lengths = {"a": [(20, 5), (70, 12), (33, 1)], "b": [(90, 30), (5, 7)]}
    for tenant, reqs in lengths.items():
        for x, y in reqs:
            sched.add_request(make(tenant, x, y))
    run(sched, depth=depth)
    for tenant, reqs in lengths.items():
        assert charged(sched, tenant) == sum(x + 2 * (y - 1) for x, y in reqs)
        assert sched.fair_snapshot()["tenants"][tenant]["finished"] == len(reqs)


def test_vtc_admits_the_least_served_tenant_first(model):
    sched, make = scheduler(model, {"scheduler": "vtc"}, max_seqs=1), Requests().make
    for _ in range(3):
        sched.add_request(make("a", 10, 4))
    step(sched)  # a's first request runs; a is charged its prompt (10)
    sched.add_request(make("b", 10, 4))  # lifted to the least waiting counter: a's, 10
    admitted = []
    while sched.has_requests():
        out, _ = step(sched)
        admitted += [sched.tracked.get(r.req_id).tenant for r in out.scheduled_new_reqs]
    # a's first request ends at 10 + 2 * 3 = 16 > 10: b goes next, then a (26 after b), then a again
    assert admitted == ["b", "a", "a"]


@pytest.mark.parametrize("cls, depth", [(FairAsyncScheduler, 2), (FairSyncScheduler, 1)], ids=["async", "sync"])
def test_under_preemption_vllm_preempts_the_largest_counters_request(model, cls, depth):
    # 10 blocks of 16 tokens; each request grows to 40 + 40 tokens (5 blocks): two cannot both finish
    sched, make = scheduler(model, {"scheduler": "vtc"}, blocks=10, batched=128, cls=cls), Requests().make
    sched.add_request(make("big", 40, 40))
    sched.add_request(make("small", 40, 40))
    step(sched)  # both admitted, big first: vLLM alone would preempt small (the last admitted)
    assert [sched.tracked.get(r.request_id).tenant for r in sched.running] == ["big", "small"]
    sched.fair.adjust("big", 1000.0)  # big was served much more
    run(sched, depth=depth)
    stats = sched.fair_snapshot()
    assert stats["tenants"]["big"]["preempted"] > 0
    assert stats["tenants"]["small"]["preempted"] == 0
    assert all(v["tenant"] == "big" and v["counter"] >= 1000 for v in stats["victims"])
    for tenant in ("small", "big"):
        assert stats["tenants"][tenant]["finished"] == 1
        assert stats["tenants"][tenant]["charged"] == 40 + 2 * 39  # a preemption costs its tenant nothing more
    assert len(sched.tracked) == 0


def test_an_abort_leaves_no_state(model):
    sched, make = scheduler(model, {"scheduler": "vtc"}, max_seqs=1), Requests().make
    running, waiting = make("a", 10, 50), make("a", 10, 50)
    sched.add_request(running)
    sched.add_request(waiting)
    step(sched)
    step(sched)
    sched.finish_requests([running.request_id, waiting.request_id], RequestStatus.FINISHED_ABORTED)
    assert len(sched.tracked) == 0
    assert sched.fair.num_waiting() == 0 and not sched.fair.records
    assert sched.fair_snapshot()["tenants"]["a"]["aborted"] == 2
    assert not sched.has_requests() or run(sched) is not None


def test_a_rate_limited_request_ends_with_an_error_output(model):
    sched, make = scheduler(model, {"scheduler": "rpm:1"}), Requests().make
    first, second = make("a", 10, 2), make("a", 10, 2)
    sched.add_request(first)
    sched.add_request(second)
    assert second.status == RequestStatus.FINISHED_ERROR
    ends = {}
    for _, outputs in run(sched):
        for engine_outputs in outputs.values():
            for o in engine_outputs.outputs:
                if o.finish_reason is not None:
                    ends[o.request_id] = str(o.finish_reason)
    assert ends == {first.request_id: "length", second.request_id: "error"}
    assert sched.fair_snapshot()["tenants"]["a"]["rejected"] == 1


@pytest.mark.parametrize("spec", ["fcfs", "vtc", "lcf", "wvtc:2,1", "rpm:100", "lpm", "dlpm:50", "vtc-avg"])
def test_every_scheduler_serves_every_request_to_its_end(model, spec, tmp_path):
    clients = tmp_path / "clients.toml"
    clients.write_text("[clients.a]\n[clients.b]\n")
    sched = scheduler(model, {"scheduler": spec, "clients": str(clients)}, blocks=24, batched=48)
    make = Requests().make
    shared = list(range(3, 35))  # a's prompts share 32 tokens: lpm and dlpm see the prefix cache
    for i in range(6):
        sched.add_request(make("a", 40, 12, prompt=shared + [100 + i] * 8))
        sched.add_request(make("b", 20 + i, 8))
    run(sched, depth=2)
    stats = sched.fair_snapshot()
    assert [stats["tenants"][t]["finished"] for t in ("a", "b")] == [6, 6]
    assert len(sched.tracked) == 0 and sched.fair.num_waiting() == 0
    assert stats["tenants"]["a"]["cached_tokens"] > 0  # a's later prompts found the shared prefix


@pytest.mark.parametrize("spec", ["fcfs", "vtc"])
def test_the_plugin_schedules_a_burst_in_the_steps_vllm_as_shipped_does(model, spec):
    """The benchmark's burst (benchmarks/vllm_plugin.py) in small: two tenants' requests of one shape,
    all fitting at once. Whatever order the plugin picks, each step must schedule as many requests and
    tokens as vLLM's own scheduler does (the plugin adds time to a step, never a step)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    def steps(cls):
        sched, make = scheduler(model, {"scheduler": spec}, max_seqs=16, batched=256, cls=cls), Requests().make
        for k in range(16):
            sched.add_request(make("ab"[k % 2], 40, 12))
        return [sorted(out.num_scheduled_tokens.values()) for out, _ in run(sched)]

    stock = steps(Scheduler)
    assert len(stock) > 10 and stock == steps(FairSyncScheduler)
