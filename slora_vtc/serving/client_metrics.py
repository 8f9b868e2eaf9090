"""The per-client families of /metrics that the server and the gateway both export
(prometheus_client): a gauge or counter per client, requests by outcome (the words of ledger.py),
and how many clients are kept and have been forgotten."""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from slora_vtc.serving.ledger import OUTCOMES


def per_client(family, rows, value=None):
    """`family` (labelled by client) with `value(x)` for each (client, x) of `rows` (x itself without `value`)."""
    for client, x in rows:
        family.add_metric([client], x if value is None else value(x))
    return family


def by_outcome(prefix: str, failed: str, rejected: str, rows) -> CounterMetricFamily:
    """Requests ended, by outcome, per client; `failed` and `rejected` say what those mean here.
    `rows`: (client, tally) pairs, each tally with one count per outcome."""
    family = CounterMetricFamily(
        f"{prefix}_requests",
        f"requests ended, by outcome: finished, aborted (client gone, shutdown), failed ({failed}), "
        f"rejected ({rejected})",
        labels=["client", "outcome"],
    )
    for client, tally in rows:
        for outcome in OUTCOMES:
            family.add_metric([client, outcome], getattr(tally, outcome))
    return family


def client_memory(prefix: str, holder: str, known: int, forgotten: int):
    """The clients `holder` keeps numbers for, and those it forgot after they were idle."""
    yield GaugeMetricFamily(
        f"{prefix}_known_clients", f"clients the {holder} keeps numbers for (not yet forgotten)", value=known
    )
    yield CounterMetricFamily(f"{prefix}_forgotten_clients", "clients forgotten after being idle", value=forgotten)
