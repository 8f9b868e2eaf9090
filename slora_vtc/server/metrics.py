"""GET /metrics: render a Snapshot in the Prometheus text format (prometheus_client).

The service takes the snapshot on the engine thread (EngineService.snapshot); this module only
renders it, through a registry of its own (no process-wide default registry).
"""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from slora_vtc.server.stats import Snapshot

PREFIX = "slora"


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
