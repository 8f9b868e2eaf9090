"""GET /metrics of the gateway (prometheus_client, a registry of its own): per client, the service
charged, VTC counter, waiting and in-flight requests and requests by outcome; per upstream, the
budget, in-flight requests, errors and timeouts.

Client labels are bounded and sticky, as the server's: the dispatcher's ledger (serving/ledger.py)
names at most its `max_labels` clients, moves labels to the busiest at most every RELABEL_S, and
sums the rest under client="other", the clients forgotten after being idle included. A series
counts from when its client got its label, so none jumps between its name and "other", and all of
a family's series sum to the total. Outcomes are the ledger's words (OUTCOMES), as the server's."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from slora_vtc.gateway.context import GatewayContext
from slora_vtc.serving.client_metrics import by_outcome, client_memory, per_client

PREFIX = "slora_gateway"


class _Collector:
    def __init__(self, ctx: GatewayContext):
        self.ctx = ctx

    def collect(self):
        d = self.ctx.dispatcher
        ledger = d.stats
        ledger.relabel(d.now())
        rows = sorted(ledger.labelled().items())  # O(labelled clients)
        counters = d.scheduler.counters() if d.scheduler.traits.ledger else {}

        def family(kind, name, doc, values):
            return per_client(kind(f"{PREFIX}_{name}", doc, labels=["client"]), values)

        yield family(
            GaugeMetricFamily,
            "client_service",
            "service charged (h(prompt, output tokens) of what was delivered; failed requests refunded)",
            ((c, s.service) for c, s in rows),
        )
        yield family(
            GaugeMetricFamily,
            "client_counter",
            "VTC virtual token counter (labelled clients)",
            sorted((c, counters[c]) for c in ledger.labels if c in counters),
        )
        yield family(
            GaugeMetricFamily,
            "client_waiting",
            "requests queued in the gateway",
            ((c, s.live - s.inflight) for c, s in rows),
        )
        yield family(
            GaugeMetricFamily,
            "client_inflight",
            "requests sent to an upstream, not yet ended",
            ((c, s.inflight) for c, s in rows),
        )
        yield by_outcome(PREFIX, "the upstream failed: refunded", "refused at arrival or by the upstream", rows)
        yield from client_memory(PREFIX, "gateway", len(ledger.clients), ledger.forgotten)
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


def render(ctx: GatewayContext) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(ctx))
    return generate_latest(registry)
