"""GET /metrics of the gateway (prometheus_client, a registry of its own): per client, the
service charged, VTC counter, waiting and in-flight requests and outcomes; per upstream, the
budget, in-flight requests, errors and timeouts.

Client labels are bounded: the `max_labels` clients with the most service by name, the others
summed under client="other", with the totals of clients forgotten after being idle."""

from collections import defaultdict

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from slora_vtc.gateway.context import GatewayContext

PREFIX = "slora_gateway"
MAX_CLIENT_LABELS = 100
OTHER = "other"
OUTCOMES = ("finished", "failed", "rejected", "aborted")


class _Collector:
    def __init__(self, ctx: GatewayContext, max_labels: int):
        self.ctx, self.max_labels = ctx, max_labels

    def collect(self):
        d = self.ctx.dispatcher
        stats = dict(d.stats)
        waiting = d.scheduler.waiting_by_client()
        counters = d.scheduler.counters() if d.scheduler.traits.ledger else {}
        names = sorted(set(stats) | set(waiting), key=lambda c: -stats[c].service if c in stats else 0)
        label = {name: name if i < self.max_labels else OTHER for i, name in enumerate(names)}

        def family(kind, name, doc, values):
            summed = defaultdict(float)
            for client, value in values:
                summed[label.get(client, OTHER)] += value
            f = kind(f"{PREFIX}_{name}", doc, labels=["client"])
            for client, value in sorted(summed.items()):
                f.add_metric([client], value)
            return f

        forgotten = d.forgotten  # clients forgotten after being idle: their totals stay, under "other"
        yield family(
            GaugeMetricFamily,
            "client_service",
            "service charged (h(prompt, output tokens) of what was delivered)",
            [*((c, s.service) for c, s in stats.items()), *([(OTHER, forgotten.service)] if forgotten.service else [])],
        )
        yield family(GaugeMetricFamily, "client_counter", "VTC virtual token counter", counters.items())
        yield family(GaugeMetricFamily, "client_waiting", "requests queued in the gateway", waiting.items())
        yield family(
            GaugeMetricFamily,
            "client_inflight",
            "requests sent to an upstream, not yet ended",
            ((c, s.inflight) for c, s in stats.items()),
        )
        outcomes = CounterMetricFamily(f"{PREFIX}_requests", "requests by how they ended", labels=["client", "outcome"])
        summed = defaultdict(float)
        for client, s in [*stats.items(), *([(OTHER, forgotten)] if forgotten.outcomes else [])]:
            for outcome in OUTCOMES:
                summed[label.get(client, OTHER), outcome] += s.outcomes.get(outcome, 0)
        for (client, outcome), value in sorted(summed.items()):
            outcomes.add_metric([client, outcome], value)
        yield outcomes
        yield from self._upstreams()
        yield GaugeMetricFamily(f"{PREFIX}_waiting", "requests queued in the gateway", value=d.num_waiting)

    def _upstreams(self):
        ups = self.ctx.pool.upstreams
        for kind, name, doc, value in (
            (GaugeMetricFamily, "upstream_inflight", "requests in flight on the upstream", lambda u: u.inflight),
            (GaugeMetricFamily, "upstream_limit", "the upstream's concurrency budget", lambda u: u.limit),
            (GaugeMetricFamily, "upstream_up", "1 while the upstream is taking requests", lambda u: float(u.up)),
            (CounterMetricFamily, "upstream_finished", "requests the upstream served to the end", lambda u: u.finished),
            (
                CounterMetricFamily,
                "upstream_errors",
                "failed connections, broken streams and 5xx answers",
                lambda u: u.errors,
            ),
            (
                CounterMetricFamily,
                "upstream_timeouts",
                "requests the upstream did not answer in time",
                lambda u: u.timeouts,
            ),
        ):
            f = kind(f"{PREFIX}_{name}", doc, labels=["upstream"])
            for u in ups:
                f.add_metric([u.url], value(u))
            yield f


def render(ctx: GatewayContext, max_labels: int = MAX_CLIENT_LABELS) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(ctx, max_labels))
    return generate_latest(registry)
