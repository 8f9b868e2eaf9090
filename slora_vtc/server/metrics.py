"""GET /metrics: render a Snapshot in the Prometheus text format (prometheus_client).

The service takes the snapshot on the engine thread (EngineService.snapshot, O(labelled
clients)); this module renders it, off the event loop, through a registry of its own (no
process-wide default registry) that also holds prometheus_client's process and platform
collectors, and a second process collector for the engine's process where it runs in one of its
own. Client labels are bounded: the labelled clients by name, the rest as client="other"
(serving/ledger.py says how the labelled set changes and why counters stay monotone). Requests
are counted by outcome (`slora_requests_total{client, outcome}`, the words of serving/ledger.py,
the same as the gateway's), finished ones also by OpenAI's finish reason.
"""

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

from slora_vtc.server.stats import FINISH_REASONS, Histogram, Snapshot
from slora_vtc.serving.client_metrics import by_outcome, client_memory, per_client
from slora_vtc.serving.window import WINDOW_S

PREFIX = "slora"
ENGINE_NAMESPACE = f"{PREFIX}_engine"  # the engine process's process_* series: slora_engine_process_*

COUNTS = [
    ("requests_admitted", "requests accepted by the scheduler", lambda c: c.admitted),
    ("served_input_tokens", "prompt tokens prefilled", lambda c: c.input_tokens),
    ("served_output_tokens", "tokens generated", lambda c: c.output_tokens),
]
CACHED_COUNTS = [
    ("served_input_tokens_cached", "prompt tokens served from the prefix cache", lambda c: c.cached_input_tokens),
    ("served_input_tokens_uncached", "prompt tokens computed", lambda c: c.input_tokens - c.cached_input_tokens),
]
HISTOGRAMS = [
    ("time_to_first_token_seconds", "arrival to the first token", lambda c: c.time_to_first_token),
    ("e2e_request_latency_seconds", "arrival to the last token, finished requests", lambda c: c.latency),
    ("queue_time_seconds", "arrival to the first admission", lambda c: c.queue_time),
    ("inter_token_latency_seconds", "time between two tokens of a request", lambda c: c.token_gap),
]


@dataclass(frozen=True)
class BuildInfo:
    version: str
    scheduler: str
    model: str


class _SnapshotCollector:
    def __init__(self, snap: Snapshot, build: BuildInfo, http: dict[tuple[str, str], int]):
        self.snap, self.build, self.http = snap, build, http

    def collect(self):
        s = self.snap
        clients = sorted(s.clients.items())
        for name, doc, value in COUNTS + (CACHED_COUNTS if s.prefix_cache else []):
            yield per_client(CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["client"]), clients, value)
        yield by_outcome(PREFIX, "the model or the engine failed", "refused at arrival", clients)
        reasons = CounterMetricFamily(
            f"{PREFIX}_requests_by_finish_reason", "finished requests, by finish reason", labels=["client", "reason"]
        )
        for client, stats in clients:
            for reason in FINISH_REASONS:
                reasons.add_metric([client, reason], stats.reasons[reason])
        yield reasons
        for name, doc, value in HISTOGRAMS:
            family = HistogramMetricFamily(f"{PREFIX}_{name}", doc, labels=["client"])
            for client, stats in clients:
                hist = value(stats)
                family.add_metric([client], _buckets(hist), hist.total)
            yield family
        yield _gauge("client_counter", "the scheduler's service counter (VTC: virtual tokens)", s.counters)
        yield _gauge("client_weight", "the client's weight in the scheduler's share", s.weights)
        yield _gauge(
            "client_service_share", f"share of the service (x + 2 y tokens) in the last {WINDOW_S} s", s.shares
        )
        yield _gauge("client_waiting", "requests queued, not yet admitted", s.waiting)
        yield _gauge("client_running", "requests in the running batch", s.running)
        yield GaugeMetricFamily(
            f"{PREFIX}_jain_index",
            f"Jain's fairness index over the service rates of the clients active in the last {WINDOW_S} s",
            value=s.jain,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_active_clients",
            f"clients served in the last {WINDOW_S} s or with a request now",
            value=s.active_clients,
        )
        yield from client_memory(PREFIX, "server", s.known_clients, s.forgotten_clients)
        yield GaugeMetricFamily(f"{PREFIX}_pool_tokens", "slots in the unified memory pool", value=s.pool_size)
        yield GaugeMetricFamily(f"{PREFIX}_pool_used_tokens", "slots held by KV caches and adapters", value=s.pool_used)
        yield GaugeMetricFamily(
            f"{PREFIX}_pool_cached_tokens",
            "of the slots held, those the prefix cache keeps for no running request (evicted when needed)",
            value=s.pool_cached,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_adapters_resident", "LoRA adapters loaded in the pool", value=s.adapters_resident
        )
        http = CounterMetricFamily(
            f"{PREFIX}_http_requests",
            "HTTP requests answered, by route template and status",
            labels=["route", "status"],
        )
        for (route, status), n in sorted(self.http.items()):
            http.add_metric([route, status], n)
        yield http
        yield InfoMetricFamily(
            f"{PREFIX}_build",
            "the server's version, scheduler and model",
            value={"version": self.build.version, "scheduler": self.build.scheduler, "model": self.build.model},
        )


def _buckets(hist: Histogram) -> list[tuple[str, int]]:
    cumulative, out = 0, []
    for bound, count in zip(hist.bounds, hist.counts):
        cumulative += count
        out.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    return out


def _gauge(name: str, doc: str, values: dict[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["client"])
    for client, value in sorted(values.items()):
        family.add_metric([client], value)
    return family


def render(snap: Snapshot, build: BuildInfo, http: dict[tuple[str, str], int], engine_pid: int | None = None) -> bytes:
    """The exposition text (CPU work: call it off the event loop). `engine_pid`: the engine's own process, whose
    CPU, memory and open files are exported as `slora_engine_process_*` beside the server's `process_*`."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    if engine_pid is not None:
        ProcessCollector(namespace=ENGINE_NAMESPACE, pid=lambda: engine_pid, registry=registry)
    PlatformCollector(registry=registry)
    registry.register(_SnapshotCollector(snap, build, http))
    return generate_latest(registry)
