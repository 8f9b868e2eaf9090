"""GET /metrics: per-client and pool state in the Prometheus text format (prometheus_client).

The engine thread owns the numbers: a scrape asks it for a Snapshot between two steps, then
renders that snapshot through a registry of its own (no process-wide default registry).
"""

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from slora_vtc.request import State

if TYPE_CHECKING:
    from slora_vtc.server.service import EngineService

PREFIX = "slora"


@dataclass
class ClientStats:
    """One client's requests and served tokens since the server started (engine thread only)."""

    admitted: int = 0  # accepted by the scheduler at arrival
    rejected: int = 0  # refused at arrival (rate limit, shutdown)
    finished: int = 0
    aborted: int = 0  # client disconnected, shutdown, model failure
    input_tokens: int = 0  # prompts prefilled
    output_tokens: int = 0  # tokens generated

    def ended(self, state: State) -> None:
        if state is State.FINISHED:
            self.finished += 1
        elif state is State.ABORTED:
            self.aborted += 1
        elif state is State.REJECTED:
            self.rejected += 1

    def served(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens


@dataclass(frozen=True)
class Snapshot:
    clients: dict[str, ClientStats]
    counters: dict[str, float]  # VTC's virtual counters (empty for schedulers without one)
    waiting: dict[str, int]
    running: dict[str, int]
    pool_size: int
    pool_used: int
    adapters_resident: int


def take_snapshot(service: "EngineService") -> Snapshot:
    """Run on the engine thread (EngineService.call)."""
    engine = service.engine
    scheduler = getattr(engine.scheduler, "inner", engine.scheduler)  # under a RateLimited wrapper
    names = set(service.stats) | {r.client for r in engine.running}
    counter = getattr(scheduler, "counter", None)
    running: dict[str, int] = {}
    for req in engine.running:
        running[req.client] = running.get(req.client, 0) + 1
    return Snapshot(
        clients={name: replace(service.stats[name]) for name in names},
        counters={name: counter(name) for name in names} if counter else {},
        waiting=engine.scheduler.waiting_by_client(),
        running=running,
        pool_size=engine.memory.pool.size,
        pool_used=engine.memory.pool.num_used,
        adapters_resident=len(engine.memory.adapters),
    )


class _SnapshotCollector:
    def __init__(self, snap: Snapshot):
        self.snap = snap

    def collect(self):
        s = self.snap
        per_client = [
            (CounterMetricFamily, "requests_admitted", "requests accepted by the scheduler", lambda c: c.admitted),
            (CounterMetricFamily, "requests_rejected", "requests refused at arrival (rate limit, shutdown)", lambda c: c.rejected),
            (CounterMetricFamily, "requests_finished", "requests served to the end", lambda c: c.finished),
            (CounterMetricFamily, "requests_aborted", "requests ended early (client gone, shutdown, model error)", lambda c: c.aborted),
            (CounterMetricFamily, "served_input_tokens", "prompt tokens prefilled", lambda c: c.input_tokens),
            (CounterMetricFamily, "served_output_tokens", "tokens generated", lambda c: c.output_tokens),
        ]
        for kind, name, doc, value in per_client:
            family = kind(f"{PREFIX}_{name}", doc, labels=["client"])
            for client, stats in sorted(s.clients.items()):
                family.add_metric([client], value(stats))
            yield family
        yield self._gauge("client_counter", "VTC virtual token counter", s.counters)
        yield self._gauge("client_waiting", "requests queued, not yet admitted", {c: s.waiting.get(c, 0) for c in s.clients | s.waiting})
        yield self._gauge("client_running", "requests in the running batch", {c: s.running.get(c, 0) for c in s.clients | s.running})
        yield GaugeMetricFamily(f"{PREFIX}_pool_tokens", "slots in the unified memory pool", value=s.pool_size)
        yield GaugeMetricFamily(f"{PREFIX}_pool_used_tokens", "slots held by KV caches and adapters", value=s.pool_used)
        yield GaugeMetricFamily(f"{PREFIX}_adapters_resident", "LoRA adapters loaded in the pool", value=s.adapters_resident)

    @staticmethod
    def _gauge(name: str, doc: str, values: dict[str, float]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["client"])
        for client, value in sorted(values.items()):
            family.add_metric([client], value)
        return family


def render(snap: Snapshot) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap))
    return generate_latest(registry)
