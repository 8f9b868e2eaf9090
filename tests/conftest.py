import os

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from slora_vtc.backends.base import ModelBackend, StepResult  # noqa: E402
from slora_vtc.builder import build_engine  # noqa: E402
from slora_vtc.clock import VirtualClock  # noqa: E402
from slora_vtc.config import EngineConfig  # noqa: E402
from slora_vtc.data import A10G_PROFILE, REAL_TRACE, data_file, measured_run  # noqa: E402
from slora_vtc.engine import Engine  # noqa: E402
from slora_vtc.request import Request, State  # noqa: E402
from slora_vtc.results import Response, RunResult  # noqa: E402

ENDED = (State.FINISHED, State.REJECTED, State.ABORTED)
REPO = Path(__file__).resolve().parent.parent
ARENA_FIXTURE = REPO / "traces" / "arena_fixture.jsonl"


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
    return EngineConfig(pool_tokens=pool_tokens, lora_rank=lora_rank, **kw)


def make_engine(scheduler, backend: ModelBackend | None = None, **cfg) -> Engine:
    """An engine on a fresh VirtualClock (a FixedBackend on that clock unless one is given)."""
    clock = VirtualClock()
    backend = backend or FixedBackend(clock=clock)
    if isinstance(backend, FixedBackend) and backend.clock is None:
        backend.clock = clock
    return build_engine(config(**cfg), scheduler, backend, clock)


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


def a10g_profile() -> Path:
    return data_file(A10G_PROFILE)


def lmsys_trace() -> Path:
    return data_file(REAL_TRACE)


@pytest.fixture
def paper_results():
    """The artifact's measured result files, by name (they ship in data/measured/)."""
    return measured_run
