"""The continuous-batching loop (docs/design.md, "The engine loop") on a fixed-time backend and a virtual clock.

FixedBackend: every prefill takes 1.0 s, every decode step 0.1 s.
"""

import pytest

from slora_vtc.backends.base import StepResult
from slora_vtc.request import State
from slora_vtc.sched import FCFS, build_scheduler
from tests.helpers.engine import FixedBackend, assert_clean, make_engine, req


class CountingFCFS(FCFS):
    """FCFS that records how many decode steps had run at each admission attempt."""

    def __init__(self):
        super().__init__()
        self.backend = None
        self.attempts: list[int] = []

    def select(self, budget, now):
        self.attempts.append(self.backend.kinds().count("decode"))
        return super().select(budget, now)


def counting_engine(**cfg):
    sched = CountingFCFS()
    engine = make_engine(sched, **cfg)
    sched.backend = engine.backend
    return engine, sched


def test_idle_engine_jumps_to_the_arrival_and_prefills():
    engine = make_engine(FCFS())
    r = req("a", 10, 3, arrival=5.0)
    engine.run([r])
    assert engine.backend.calls == [
        ("prefill", [r.rid], 5.0),
        ("decode", [r.rid], 6.0),
        ("decode", [r.rid], pytest.approx(6.1)),
    ]
    assert r.first_token_time == 6.0  # the prefill yields token 1
    assert r.finish_time == pytest.approx(6.2)
    assert engine.clock.now() == pytest.approx(6.2)
    assert_clean(engine, [r])


def test_idle_gap_between_requests():
    engine = make_engine(FCFS())
    r1, r2 = req("a", 10, 2), req("a", 10, 2, arrival=50.0)
    engine.run([r1, r2])
    assert [t for _, _, t in engine.backend.calls] == [0.0, 1.0, 50.0, 51.0]


def test_output_of_one_token_finishes_at_prefill():
    engine = make_engine(FCFS())
    r = req("a", 10, 1)
    engine.run([r])
    assert engine.backend.kinds() == ["prefill"]
    assert r.state is State.FINISHED and r.finish_time == 1.0


def test_new_requests_wait_max_wait_steps_decode_steps():
    engine, sched = counting_engine(max_wait_steps=3)
    r1, r2 = req("a", 50, 20), req("b", 10, 3, arrival=0.5)  # r2 arrives during r1's prefill
    engine.run([r1, r2])
    kinds = engine.backend.kinds()
    assert kinds[:6] == ["prefill", "decode", "decode", "decode", "prefill", "decode"]
    assert engine.backend.calls[4][1] == [r2.rid]  # the mini-batch holds only the new request
    assert engine.backend.calls[5][1] == [r1.rid, r2.rid]  # then merged
    assert sched.attempts[:2] == [0, 3]
    assert_clean(engine, [r1, r2])


def test_no_admission_attempt_before_max_wait_steps():
    engine, sched = counting_engine(max_wait_steps=10)
    r1, r2 = req("a", 50, 30), req("b", 10, 3, arrival=0.5)
    engine.run([r1, r2])
    assert sched.attempts[:2] == [0, 10]
    assert engine.backend.kinds()[11] == "prefill"


def test_after_a_failed_attempt_it_asks_on_every_step():
    # r2 (121 held, 39 to generate) joins r1 (50 + g, 20 - g) only when 211 - g < 200, i.e. g >= 12:
    # after 11 decode steps (the prefill made token 1)
    engine, sched = counting_engine(max_wait_steps=3)
    r1, r2 = req("a", 50, 20), req("b", 120, 40, arrival=0.5)
    engine.run([r1, r2])
    assert sched.attempts[:10] == [0, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    kinds = engine.backend.kinds()
    assert kinds[:12] == ["prefill"] + ["decode"] * 11 and kinds[12] == "prefill"
    assert engine.backend.calls[12][1] == [r2.rid]
    assert_clean(engine, [r1, r2])


def test_waiting_request_runs_as_soon_as_the_last_running_one_finishes():
    # r2 cannot join r1; a far later arrival must not make the engine idle until then
    engine = make_engine(FCFS())
    r1, r2, r3 = req("a", 30, 5), req("b", 170, 25, arrival=0.5), req("c", 5, 2, arrival=1000.0)
    engine.run([r1, r2, r3])
    assert r1.finish_time == pytest.approx(1.4)
    assert r2.first_token_time == pytest.approx(2.4)
    assert r3.first_token_time == 1001.0
    assert_clean(engine, [r1, r2, r3])


def test_request_that_can_never_fit_is_rejected_at_arrival():
    engine = make_engine(build_scheduler("vtc", ["a", "b"]))
    reqs = [req("a", 10, 5), req("b", 150, 50, arrival=0.2), req("b", 20, 5, arrival=0.3), req("a", 10, 5, arrival=3.0)]
    engine.run(reqs)
    assert [r.state for r in reqs] == [State.FINISHED, State.REJECTED, State.FINISHED, State.FINISHED]
    assert "never fit" in reqs[1].reason
    served = {rid for _, rids, _ in engine.backend.calls for rid in rids}
    assert reqs[1].rid not in served
    assert_clean(engine, reqs)


def test_prompt_longer_than_batch_max_tokens_is_rejected():
    engine = make_engine(FCFS(), pool_tokens=10_000, batch_max_tokens_override=100)
    reqs = [req("a", 101, 5), req("a", 100, 5)]
    engine.run(reqs)
    assert [r.state for r in reqs] == [State.REJECTED, State.FINISHED]


def test_adapter_slots_come_from_the_pool_during_the_run():
    seen = []
    engine = make_engine(FCFS(), pool_tokens=200, lora_rank=2)
    reqs = [req("a", 10, 3, adapter="A"), req("b", 10, 3, adapter="B")]
    engine.run(reqs, on_step=lambda: seen.append((engine.memory.pool.num_used, set(engine.memory.adapters))))
    # after the prefill: 2 adapters x 8 slots + 2 prompts x 10 slots
    assert seen[0] == (2 * 8 + 2 * 10, {"A", "B"})
    assert seen[1] == (2 * 8 + 2 * 11, {"A", "B"})  # one decode step: one slot each
    assert_clean(engine, reqs)


def test_abort_frees_a_running_and_a_waiting_request():
    engine = make_engine(FCFS(), max_wait_steps=100)
    reqs = [req("a", 10, 50), req("b", 10, 5, arrival=0.5), req("c", 10, 5, arrival=0.5)]

    def on_step():
        if engine.clock.now() == pytest.approx(1.5):
            engine.abort(reqs[0])
            engine.abort(reqs[2])

    engine.run(reqs, on_step=on_step)
    assert [r.state for r in reqs] == [State.ABORTED, State.FINISHED, State.ABORTED]
    assert_clean(engine, reqs)


class FailingBackend(FixedBackend):
    """Fails the request at index 1 of the third decode step."""

    def decode(self, reqs):
        result = super().decode(reqs)
        return StepResult(result.tokens, result.elapsed, (1,) if len(self.calls) == 4 else ())


def test_a_failed_request_is_aborted_and_its_slots_freed():
    engine = make_engine(FCFS(), backend=FailingBackend())
    reqs = [req("a", 10, 8), req("b", 10, 8)]
    engine.run(reqs)
    assert [r.state for r in reqs] == [State.FINISHED, State.ABORTED]
    assert reqs[1].generated == 3
    assert_clean(engine, reqs)


@pytest.mark.parametrize("spec", ["fcfs", "vtc", "lcf", "rpm:2", "wvtc:1,2", "vtc-oracle", "vtc-avg"])
def test_every_request_ends_and_counts_add_up(spec):
    engine = make_engine(build_scheduler(spec, ["a", "b"]), lora_rank=1, max_wait_steps=4)
    reqs = [req("ab"[i % 2], 5 + 7 * i % 60, 1 + 5 * i % 40, arrival=0.3 * i, adapter="ab"[i % 2]) for i in range(30)]
    reqs.append(req("a", 180, 30, arrival=2.0, adapter="a"))  # never fits
    engine.run(reqs)
    assert_clean(engine, reqs)
    assert reqs[-1].state is State.REJECTED
    finished = [r for r in reqs if r.state is State.FINISHED]
    assert len(finished) + sum(r.state is State.REJECTED for r in reqs) == len(reqs)
    if not spec.startswith("rpm"):
        assert len(finished) == 30
