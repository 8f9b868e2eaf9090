"""Optimistic admission: preemption by recompute ends every request once, frees the pool, and counts
what it recomputes; with memory to spare it changes nothing."""

import pytest

from slora_vtc.backends.sim import sim_backend
from slora_vtc.builder import build_engine
from slora_vtc.clock import VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.errors import UserError
from slora_vtc.experiment import Experiment
from slora_vtc.request import Request, State
from slora_vtc.runner import run_experiment
from slora_vtc.sched import Delegating, build_scheduler
from slora_vtc.sched.base import Scheduler
from tests.helpers.engine import run_engine
from tests.helpers.sched import Plain


class Recorder(Delegating):
    """Wraps a scheduler: notes each victim, the running batch it came from and its tokens so far."""

    def __init__(self, inner: Scheduler):
        super().__init__(inner)
        self.victims = []

    def choose_victim(self, running, now):
        victim = self.inner.choose_victim(running, now)
        self.victims.append((victim, [r.rid for r in running], victim.generated))
        return victim


def overcommitted(n=12, prompt=100, new=800) -> list[Request]:
    return [Request(f"c{i % 2}", prompt, new, 0.0, rid=i, adapter=None) for i in range(n)]


def run(requests, scheduler="fcfs", pool=3000, admission="optimistic", cache=False):
    recorder = Recorder(build_scheduler(scheduler, ["c0", "c1"]))
    engine, ended = run_engine(
        recorder, requests, sim_backend(), pool_tokens=pool, admission=admission, prefix_cache=cache
    )
    return engine, recorder, ended


def test_preemption_ends_every_request_once_and_frees_the_pool():
    requests = overcommitted()
    engine, recorder, ended = run(requests)
    assert recorder.victims, "12 x 900 tokens in a 3,000-token pool must preempt"
    assert sorted(r.rid for r in ended) == list(range(12))
    assert all(r.state is State.FINISHED and r.generated == 800 for r in requests)
    assert engine.memory.pool.num_used == 0 and not engine.running


def test_fcfs_preempts_the_latest_arrival_and_counts_what_it_recomputes():
    requests = overcommitted()
    _, recorder, _ = run(requests)
    for victim, running, _ in recorder.victims:
        assert victim.rid == max(running)  # all arrive at 0: the latest arrival is the highest rid
    # Without a prefix cache a resumed request computes its prompt and every generated token again,
    # except the newest, whose K/V was never computed: prompt + generated - 1 per preemption.
    expected = {r.rid: 0 for r in requests}
    for victim, _, generated in recorder.victims:
        expected[victim.rid] += 100 + generated - 1
    assert {r.rid: r.recomputed for r in requests} == expected
    assert {r.rid: r.preemptions for r in requests} == {
        r.rid: sum(v.rid == r.rid for v, _, _ in recorder.victims) for r in requests
    }


def test_with_room_to_spare_optimistic_admission_changes_nothing():
    def responses(admission):
        return run_experiment(
            Experiment.of(suite="overload", scheduler="vtc", duration=60, pool_tokens=200_000, admission=admission)
        ).responses

    assert responses("optimistic") == responses("conservative")


def test_conservative_admission_never_preempts():
    requests = overcommitted()
    _, recorder, _ = run(requests, admission="conservative")
    assert not recorder.victims and all(r.generated == 800 for r in requests)


def test_a_scheduler_that_cannot_take_requests_back_is_refused_under_optimistic_admission():
    with pytest.raises(UserError, match="preempted"):
        build_engine(EngineConfig(admission="optimistic"), Plain(), sim_backend(), VirtualClock())


def test_a_horizon_aborts_what_is_left_and_frees_the_pool():
    requests = overcommitted()
    late = Request("c0", 10, 10, 500.0, rid=99)  # arrives after the horizon: never sent, aborted too
    engine, ended = run_engine(
        "vtc", [*requests, late], sim_backend(), clients=["c0", "c1"], pool_tokens=3000, prefix_cache=True, until=5.0
    )
    assert sorted(r.rid for r in ended) == [*range(12), 99]
    finished = [r for r in ended if r.state is State.FINISHED]
    assert not finished and all(r.state is State.ABORTED for r in ended)  # 800 tokens take far more than 5 s
    assert 5.0 <= engine.clock.now() < 6.0 and engine.memory.pool.num_used == 0 and not engine.busy
