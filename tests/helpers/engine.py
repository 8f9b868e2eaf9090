"""Engines for the tests, built as the code builds them (slora_vtc.builder.build_engine): a fixed-time
backend, requests by shape, one function that builds an engine and one that also runs requests
through it, and the checks every finished run must pass."""

from collections.abc import Callable, Iterable
from dataclasses import replace

from slora_vtc.backends.base import ModelBackend, StepResult
from slora_vtc.backends.sim import TESTBEDS, SimBackend
from slora_vtc.builder import build_engine
from slora_vtc.clock import VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.engine import Engine
from slora_vtc.request import Request, State
from slora_vtc.results import Response, RunResult
from slora_vtc.sched import build_scheduler
from slora_vtc.sched.base import Scheduler

ENDED = (State.FINISHED, State.REJECTED, State.ABORTED)


class FixedBackend(ModelBackend):
    """Every prefill takes `prefill_s`, every decode step `decode_s`; records each call.

    `calls` holds (kind, [rid, ...], start time) so tests can check what ran when.
    """

    def __init__(self, prefill_s: float = 1.0, decode_s: float = 0.1, clock: VirtualClock | None = None):
        self.prefill_s, self.decode_s, self.clock = prefill_s, decode_s, clock
        self.calls: list[tuple[str, list[int], float]] = []

    def _record(self, kind: str, reqs: list[Request]) -> None:
        self.calls.append((kind, [r.rid for r in reqs], self.clock.now() if self.clock else float("nan")))

    def prefill(self, reqs):
        self._record("prefill", reqs)
        return StepResult([None] * len(reqs), self.prefill_s)

    def decode(self, reqs):
        self._record("decode", reqs)
        return StepResult([None] * len(reqs), self.decode_s)

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.calls]


def req(client: str, prompt: int, out: int, arrival: float = 0.0, rid: int = -1, adapter: str | None = None) -> Request:
    return Request(client, prompt, out, arrival, rid=rid, adapter=adapter)


def config(pool_tokens: int = 200, lora_rank: int = 0, **kw) -> EngineConfig:
    """The tests' engine config: a 200-token pool and no adapter slots unless told."""
    return EngineConfig(pool_tokens=pool_tokens, lora_rank=lora_rank, **kw)


def make_engine(
    scheduler: Scheduler | str,
    backend: ModelBackend | None = None,
    *,
    clients: Iterable[str] = (),
    base: EngineConfig | None = None,
    clock: VirtualClock | None = None,
    on_end: Callable[[Request], None] | None = None,
    **cfg,
) -> Engine:
    """An engine on a virtual clock (a fresh one unless given), built by build_engine.

    `scheduler`: a Scheduler, or a spec that build_scheduler builds for `clients`. `backend`: a
    FixedBackend on the engine's clock unless one is given. The config: `base` (config() unless
    given) with the EngineConfig fields in `cfg` replaced. `on_end` hears of every request that ends.
    """
    clock = clock or VirtualClock()
    if isinstance(scheduler, str):
        scheduler = build_scheduler(scheduler, list(clients))
    backend = backend or FixedBackend(clock=clock)
    if isinstance(backend, FixedBackend) and backend.clock is None:
        backend.clock = clock
    return build_engine(replace(base or config(), **cfg), scheduler, backend, clock, on_end=on_end)


def run_engine(
    scheduler: Scheduler | str,
    requests: list[Request],
    backend: ModelBackend | None = None,
    *,
    on_step: Callable[[Engine], None] | None = None,
    until: float | None = None,
    **options,
) -> tuple[Engine, list[Request]]:
    """make_engine(scheduler, backend, **options), then run `requests` to the end (or until `until`);
    `on_step(engine)` after every forward pass. Returns the engine and the requests in the order
    they ended."""
    ended: list[Request] = []
    engine = make_engine(scheduler, backend, on_end=ended.append, **options)
    engine.run(requests, on_step=(lambda: on_step(engine)) if on_step else None, until=until)
    return engine, ended


def outcomes(requests: list[Request], spec: str, clients: Iterable[str] = (), **cfg) -> tuple[list[tuple], dict]:
    """Run copies of the requests through an engine on the simulator (`spec`'s scheduler for
    `clients`, else the requests' clients; config() with `cfg` replaced); how each ended, and the
    scheduler's counters."""
    copies = [
        Request(r.client, r.prompt_len, r.max_new_tokens, r.arrival, rid=r.rid, prompt_ids=r.prompt_ids)
        for r in requests
    ]
    scheduler = build_scheduler(spec, list(clients) or sorted({r.client for r in requests}))
    make_engine(scheduler, SimBackend(TESTBEDS["a10g-2024"]), base=config(), **cfg).run(copies)
    outcome = [
        (r.rid, r.state, r.reason, r.generated, r.first_admitted, r.first_token_time, r.finish_time, r.preemptions)
        + (r.recomputed, r.cached_tokens)
        for r in copies
    ]
    return outcome, scheduler.counters() if scheduler.traits.ledger else {}


def assert_clean(engine: Engine, requests: list[Request]) -> None:
    """After a run: no slot leaked, no adapter resident, every request ended, counts add up."""
    pool = engine.memory.pool
    assert pool.num_free == pool.size
    assert engine.memory.adapters == {}
    assert not engine.running and engine.scheduler.num_waiting() == 0
    assert all(r.state in ENDED for r in requests)
    finished = [r for r in requests if r.state is State.FINISHED]
    assert sum(r.generated for r in finished) == sum(r.max_new_tokens for r in finished)
    for r in requests:
        assert r.kv_slots == []
        if r.state is State.REJECTED:
            assert r.generated == 0 and r.first_token_time is None


def result_of(rows: list[tuple], total_time: float) -> RunResult:
    """A RunResult from (client, prompt, output, req_time, first_token_latency, latency[, status])."""
    return RunResult({}, total_time, tuple(Response(*row) for row in rows))
