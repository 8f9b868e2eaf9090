"""The plugin's step log (`"step_log": PATH`): vLLM's scheduler in this process with a made-up model
(engine.py), each step's record read back with `read_step_log` and held against what `schedule()`
scheduled. Expected records are worked out by hand from the requests' lengths, the token budget and
vLLM's block size (16); the timing rule is checked on StepLog alone with made-up times."""

from types import SimpleNamespace

import pytest

from slora_vtc.steplog import read_step_log
from slora_vtc.vllm.scheduler import FairAsyncScheduler, FairSyncScheduler
from slora_vtc.vllm.steps import StepLog
from tests.vllm.engine import Requests, run, scheduler

SHAPE = ("prefill_tokens", "prefill_pairs", "prefill_reqs", "cached_tokens", "decode_reqs", "context_tokens",
         "kv_tokens", "preempted")  # fmt: skip
BOTH = pytest.mark.parametrize("cls, depth", [(FairAsyncScheduler, 2), (FairSyncScheduler, 1)], ids=["async", "sync"])


def logged(tiny_model, tmp_path, cls=FairSyncScheduler, **kwargs):
    path = tmp_path / "steps.jsonl"
    return scheduler(tiny_model, {"scheduler": "vtc", "step_log": str(path)}, cls=cls, **kwargs), path


def blocks(tokens: int) -> int:
    """The tokens that whole blocks of 16 holding `tokens` hold."""
    return 16 * -(-tokens // 16)


def shapes(path):
    return [tuple(getattr(r, k) for k in SHAPE) for r in read_step_log(path)]


@BOTH
def test_a_chunked_prompt_is_logged_chunk_by_chunk_then_its_decodes(tiny_model, tmp_path, cls, depth):
    sched, path = logged(tiny_model, tmp_path, cls, batched=64)
    sched.add_request(Requests().make("a", 150, 10))
    run(sched, depth=depth)
    # chunks [0, 64), [64, 128), [128, 150) (the last yields the first token), then 9 decodes, the
    # k-th attending over 150 + k tokens; blocks of 16: 4, 8, then 10 (160 tokens) to the end
    expected = [(64, 0, 1, 0, 0, 0, 64, 0), (64, 64 * 64, 1, 0, 0, 0, 128, 0), (22, 22 * 128, 1, 0, 0, 0, 160, 0)]
    expected += [(0, 0, 0, 0, 1, 150 + k, 160, 0) for k in range(1, 10)]
    assert shapes(path) == expected


@BOTH
def test_a_step_mixes_a_chunk_with_decodes(tiny_model, tmp_path, cls, depth):
    sched, path = logged(tiny_model, tmp_path, cls, batched=64)
    make = Requests().make
    sched.add_request(make("a", 20, 4))
    sched.add_request(make("b", 100, 2))
    run(sched, depth=depth)
    # b ends with the third step's output; under async scheduling that comes after the fourth step
    # was scheduled, so b's 7 blocks are still held in it
    b_blocks = 7 if depth == 2 else 0
    assert shapes(path) == [
        (20 + 44, 44 * 0, 2, 0, 0, 0, 16 * (2 + 3), 0),  # a's whole prompt, b's first 44 (the budget's rest)
        (56, 56 * 44, 1, 0, 1, 21, 16 * (2 + 7), 0),  # b's last 56; a decodes over its 21 tokens
        (0, 0, 0, 0, 2, 22 + 101, 16 * (2 + 7), 0),  # both decode (b's second and last token)
        (0, 0, 0, 0, 1, 23, 16 * (2 + b_blocks), 0),  # a's last token
    ]


def test_every_step_logs_what_schedule_scheduled(tiny_model, tmp_path):
    sched, path = logged(tiny_model, tmp_path, FairAsyncScheduler, batched=48)
    make = Requests().make
    for i in range(6):
        sched.add_request(make("a", 30 + 7 * i, 5 + i))
        sched.add_request(make("b", 90 - 9 * i, 12 - i))
    outputs = [out for out, _ in run(sched, depth=2) if out.total_num_scheduled_tokens]
    records = read_step_log(path)
    assert [r.step for r in records] == list(range(len(outputs)))
    for out, r in zip(outputs, records, strict=True):
        assert r.prefill_tokens + r.decode_reqs == out.total_num_scheduled_tokens  # no speculative tokens
        assert r.prefill_reqs + r.decode_reqs == len(out.num_scheduled_tokens)
        assert r.preempted == len(out.preempted_req_ids or ())
    prompts = sum(30 + 7 * i + 90 - 9 * i for i in range(6))
    assert sum(r.preempted for r in records) == 0 and sum(r.cached_tokens for r in records) == 0
    assert sum(r.prefill_tokens for r in records) == prompts  # each prompt computed once, in chunks
    outputs_after_first = sum(5 + i - 1 + 12 - i - 1 for i in range(6))
    assert sum(r.decode_reqs for r in records) == outputs_after_first


def test_a_prefix_cache_hit_is_logged_as_cached_tokens(tiny_model, tmp_path):
    sched, path = logged(tiny_model, tmp_path)
    make = Requests().make
    shared = [3 + i % 200 for i in range(32)]  # two full blocks
    sched.add_request(make("a", 0, 2, prompt=shared + [250] * 8))
    run(sched)
    sched.add_request(make("a", 0, 2, prompt=shared + [251] * 8))
    run(sched)
    first, _, second, _ = shapes(path)
    assert first[:4] == (40, 0, 1, 0)
    assert second[:4] == (8, 8 * 32, 1, 32)  # the two shared blocks came from the cache


def test_a_preemption_and_the_resumed_prefill_are_logged(tiny_model, tmp_path):
    # 10 blocks of 16 tokens (9 usable); each request grows to 40 + 40 tokens (5 blocks): both fit
    # until each holds 64 tokens, then the step that needs two fifth blocks preempts b
    sched, path = logged(tiny_model, tmp_path, blocks=10, batched=128)
    make = Requests().make
    sched.add_request(make("a", 40, 40))
    sched.add_request(make("b", 40, 40))
    run(sched)
    expected = [(80, 0, 2, 0, 0, 0, 2 * blocks(40), 0)]
    expected += [(0, 0, 0, 0, 2, 2 * (40 + k), 2 * blocks(40 + k), 0) for k in range(1, 25)]
    # a alone, 65 to 79 tokens; b's 4 full blocks stay in the prefix cache, not held
    expected += [(0, 0, 0, 0, 1, 65 + j, blocks(80), int(j == 0)) for j in range(15)]
    # b back with 40 + 25 tokens: 64 from the cache, position 64 recomputed (yields its 26th token)
    expected += [(1, 1 * 64, 1, 64, 0, 0, blocks(65), 0)]
    expected += [(0, 0, 0, 0, 1, 66 + j, blocks(80), 0) for j in range(14)]
    assert shapes(path) == expected
    assert sum(t["preempted"] for t in sched.fair_snapshot()["tenants"].values()) == 1


def test_each_step_counts_the_requests_handed_over_before_it(tiny_model, tmp_path):
    # two requests before the first step (both prefilled in it, 2 + 3 tokens out: 1 + 2 more
    # steps), a third after they end: its step counts it, the others none
    sched, path = logged(tiny_model, tmp_path)
    make = Requests().make
    sched.add_request(make("a", 20, 2))
    sched.add_request(make("b", 30, 3))
    run(sched)
    sched.add_request(make("a", 10, 2))
    run(sched)
    assert [r.arrived for r in read_step_log(path)] == [2, 0, 0, 1, 0]


def test_without_the_key_nothing_is_logged(tiny_model, tmp_path):
    sched = scheduler(tiny_model, {"scheduler": "vtc"})
    assert sched.step_log is None


def test_a_step_log_that_cannot_be_written_stops_vllm_with_one_line(tiny_model, tmp_path):
    with pytest.raises(SystemExit) as e:
        scheduler(tiny_model, {"scheduler": "vtc", "step_log": str(tmp_path / "no" / "such" / "steps.jsonl")})
    assert "steps.jsonl" in str(e.value) and "\n" not in str(e.value)


# -- the timing rule, on StepLog alone ------------------------------------------------------------


def fake_step(sched, req_id, tokens=1):
    sched.requests[req_id] = SimpleNamespace(num_computed_tokens=10, is_prefill_chunk=False)
    cached = SimpleNamespace(resumed_req_ids=set())
    return SimpleNamespace(total_num_scheduled_tokens=tokens, num_scheduled_tokens={req_id: tokens},
                           scheduled_new_reqs=[], scheduled_cached_reqs=cached, preempted_req_ids=None)  # fmt: skip


@pytest.fixture
def fake_scheduler():
    pool = SimpleNamespace(num_gpu_blocks=8, get_num_free_blocks=lambda: 5)
    return SimpleNamespace(requests={}, kv_cache_manager=SimpleNamespace(block_pool=pool), block_size=16)


def test_without_async_scheduling_a_step_runs_from_schedule_to_update(tmp_path, fake_scheduler):
    log = StepLog(tmp_path / "s.jsonl")
    for started, ended in [(10.0, 10.5), (10.75, 11.0), (12.0, 12.25)]:
        out = fake_step(fake_scheduler, "r")
        log.scheduled(fake_scheduler, out, started)
        log.updated(out, ended)
    log.close()
    records = read_step_log(tmp_path / "s.jsonl")
    assert [(r.t, r.wall_s, r.gap_s) for r in records] == [(0.0, 0.5, 0.0), (0.75, 0.25, 0.25), (2.0, 0.25, 1.0)]
    assert records[0].kv_tokens == (8 - 1 - 5) * 16


def test_under_async_scheduling_overlapping_steps_are_timed_end_to_end(tmp_path, fake_scheduler):
    log = StepLog(tmp_path / "s.jsonl")
    a, b, c, empty = (fake_step(fake_scheduler, r) for r in ("a", "b", "c", "e"))
    empty.total_num_scheduled_tokens = 0
    log.scheduled(fake_scheduler, a, 0.0)
    log.scheduled(fake_scheduler, b, 0.25)  # b is scheduled while a runs
    log.updated(a, 1.0)
    log.scheduled(fake_scheduler, empty, 1.25)  # computes nothing: not a step
    log.updated(b, 2.0)  # b ran from a's end
    log.updated(empty, 2.5)
    log.scheduled(fake_scheduler, c, 3.0)  # from b's end to 3 the engine computed nothing
    log.updated(c, 3.5)
    log.close()
    records = read_step_log(tmp_path / "s.jsonl")
    assert [(r.step, r.t, r.wall_s, r.gap_s) for r in records] == [
        (0, 0.0, 1.0, 0.0),
        (1, 1.0, 1.0, 0.0),
        (2, 3.0, 0.5, 1.0),
    ]
    assert sum(r.wall_s + r.gap_s for r in records) == 3.5  # the log's time, first start to last end
