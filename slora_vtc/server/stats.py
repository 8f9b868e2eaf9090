"""What the server counts per client (engine thread only), and the snapshot /metrics renders.

The bookkeeping of clients (outcomes, service, idle expiry, the bounded labels and "other") is the
serving layer's ClientLedger (serving/ledger.py, which says how labels move and why every series only
grows); the server adds its own numbers to each client's record: requests admitted, tokens served
(cached ones apart), the finish reasons of finished requests, and latency histograms.
"""

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from slora_vtc.cost import LinearCost
from slora_vtc.serving.ledger import MAX_LABELS, OTHER, ClientLedger, Tally
from slora_vtc.serving.window import WINDOW_S

SERVICE = LinearCost()  # service as the server's VTC charges it: h(x, y) = x + 2 y
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
FINISH_REASONS = ("stop", "length")  # OpenAI's finish_reason of a finished request


@dataclass
class Histogram:
    """Counts per bucket (not cumulative: `counts[i]` are the values in (bounds[i-1], bounds[i]]) and their sum."""

    bounds: tuple[float, ...]
    counts: list[int] = None
    total: float = 0.0

    def __post_init__(self):
        if self.counts is None:
            self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def combined(self, other: "Histogram", sign: int) -> "Histogram":
        return Histogram(
            self.bounds, [a + sign * b for a, b in zip(self.counts, other.counts)], self.total + sign * other.total
        )


def _latency() -> Histogram:
    return Histogram(LATENCY_BUCKETS)


def _token_gap() -> Histogram:
    return Histogram(TOKEN_GAP_BUCKETS)


@dataclass
class ClientStats(Tally):
    """One client's requests, served tokens and latencies (engine thread only), besides the ledger's
    outcomes and service."""

    admitted: int = 0  # accepted by the scheduler at arrival
    stopped: int = 0  # finished at a stop token or string (finish reason "stop"; the others: "length")
    input_tokens: int = 0  # prompts prefilled (each request once)
    cached_input_tokens: int = 0  # of those, served from the prefix cache at the first prefill
    output_tokens: int = 0  # tokens generated
    time_to_first_token: Histogram = field(default_factory=_latency)
    latency: Histogram = field(default_factory=_latency)  # arrival to the end, finished requests
    queue_time: Histogram = field(default_factory=_latency)  # arrival to the first admission
    token_gap: Histogram = field(default_factory=_token_gap)  # between two tokens of a request

    @property
    def reasons(self) -> dict[str, int]:
        """Finished requests by finish reason."""
        return {"stop": self.stopped, "length": self.finished - self.stopped}


class ServerStats(ClientLedger[ClientStats]):
    """The ledger of the server's clients, with its tokens and the shares of its service."""

    def __init__(self, max_labels: int = MAX_LABELS, now: Callable[[], float] = lambda: 0.0, window_s: int = WINDOW_S):
        super().__init__(ClientStats, max_labels, now, window_s)

    def served(self, client: str, input_tokens: int, cached: int, output_tokens: int, now: float) -> None:
        for stats in self.both(client):
            stats.input_tokens += input_tokens
            stats.cached_input_tokens += cached
            stats.output_tokens += output_tokens
        self.serve(client, SERVICE(input_tokens, output_tokens), now)

    def shares(self, now: float) -> dict[str, float]:
        """Each labelled client's share of the service in the window, and OTHER's."""
        self.window.advance(now)
        total, service = self.window.total, self.window.service
        if not total:
            return {}
        shares = {client: service.get(client, 0.0) / total for client in self.labels}
        return {**shares, OTHER: max(0.0, 1.0 - sum(shares.values()))}


@dataclass(frozen=True)
class Snapshot:
    """What /metrics shows, taken on the engine thread in O(labelled clients)."""

    clients: dict[str, ClientStats]  # the labelled clients since they got their label, and OTHER: the rest
    counters: dict[str, float]  # labelled clients' scheduler counters (empty for schedulers without one)
    weights: dict[str, float]  # labelled clients' weights (with counters only)
    shares: dict[str, float]  # share of the service in the window, labelled clients and OTHER
    waiting: dict[str, int]
    running: dict[str, int]
    jain: float  # Jain's index over the active clients' service rates in the window
    active_clients: int  # active in the window
    known_clients: int  # clients the server keeps numbers for (not yet forgotten)
    forgotten_clients: int  # clients forgotten after being idle
    prefix_cache: bool  # whether cached input tokens mean anything
    pool_size: int
    pool_used: int  # slots held, the prefix cache's included
    pool_cached: int  # of those, slots the prefix cache holds that no request uses (evicted when needed)
    adapters_resident: int
