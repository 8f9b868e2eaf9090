"""A driver that only peeks at the next request and pops it (vLLM's waiting-queue loop, through
PeekPopQueue) admits the same requests in the same order, with the same charges, as our engine's
select: the two are run side by side on whole workloads and compared admission by admission."""

import pytest

from slora_vtc.backends.registry import build_backend
from slora_vtc.builder import build_engine
from slora_vtc.clock import VirtualClock
from slora_vtc.engine import Engine
from slora_vtc.experiment import Experiment
from slora_vtc.request import Request
from slora_vtc.sched import Delegating, Scheduler, build_scheduler
from slora_vtc.sched.queue import PeekPopQueue


class Recorded(Delegating):
    """Our engine's path: the core's select loop; each admission noted with its charge and the counters after it."""

    def __init__(self, inner, clock):
        super().__init__(inner)
        self.log: list[tuple[int, float, dict[str, float]]] = []

    def select(self, budget, now):
        return Scheduler.select(self, budget, now)  # peek, try, pop, on_prefill: through this wrapper

    def on_prefill(self, req: Request, computed: int, cached: int, now: float) -> float:
        charged = self.inner.on_prefill(req, computed, cached, now)
        self.log.append((req.rid, charged, self.inner.counters() if self.inner.traits.ledger else {}))
        return charged


class ViaQueue(Recorded):
    """vLLM's loop over a PeekPopQueue: requests come in by add_request, preempted ones are
    prepended, and each round peeks at the head, checks it fits, pops it and reports its prefill."""

    def __init__(self, inner, clock):
        super().__init__(inner, clock)
        self.queue = PeekPopQueue(inner, clock)

    def on_arrival(self, req, now):
        return self.queue.add_request(req)

    def on_preempt(self, req, now):
        self.queue.prepend_request(req)

    def remove(self, req):
        return self.queue.remove_request(req)

    def select(self, budget, now):
        self.queue.budget = budget
        admitted = []
        while self.queue:
            req = self.queue.peek_request()
            if not budget.try_add(req):
                break
            assert self.queue.pop_request() is req
            cached = budget.cached_len(req)
            self.on_prefill(req, req.prefill_len - cached, cached, now)
            admitted.append(req)
        return admitted


def engine_for(exp: Experiment, wrap) -> tuple[Engine, list[Request]]:
    workload, config = exp.workload.build(), exp.engine_config()
    requests = exp.requests(workload)
    backend = build_backend(exp.backend.name, exp.backend_settings(config))
    clock = VirtualClock()
    scheduler = build_scheduler(exp.scheduling.scheduler, list(workload.clients), exp.scheduler_options())
    return build_engine(config, wrap(scheduler, clock.now), backend, clock), requests


CASES = [
    dict(suite="overload", scheduler="vtc", duration=120),
    dict(suite="overload_weighted", scheduler="wvtc:1,2,3,4", duration=120),
    dict(suite="poisson_short_long", scheduler="vtc-pred:0.5", duration=120),
    dict(suite="dist_shift", scheduler="lcf", duration=180),
    dict(suite="overload", scheduler="vtc", admission="optimistic", duration=120),  # preemptions: prepend
    dict(suite="prefix_qa", scheduler="dlpm:8000", prefix_cache=True, horizon=60.0),
    dict(suite="prefix_tot", scheduler="lpm", prefix_cache=True, horizon=60.0),
    dict(suite="overload", scheduler="rpm:20", duration=120),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_a_peek_pop_driver_admits_and_charges_as_the_engine(case):
    exp = Experiment.of(**case)
    logs, ends = [], []
    for wrap in (Recorded, ViaQueue):
        engine, requests = engine_for(exp, wrap)
        engine.run(requests, until=exp.workload.horizon)
        logs.append(engine.scheduler.log)
        ends.append([(r.rid, r.state, r.generated, r.finish_time) for r in requests])
    assert len(logs[0]) > 50
    assert logs[0] == logs[1]
    assert ends[0] == ends[1]
