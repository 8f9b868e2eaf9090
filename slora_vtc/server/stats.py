"""What the server counts per client (engine thread only), and the snapshot /metrics renders.

Every number is kept twice: in the client's own ClientStats and in `total` (every client ever,
forgotten ones included), so totals add up whatever expires, and the aggregate client="other" is
total minus the labelled clients, without visiting the others.

Labels (at most `max_labels` clients by name): a client gets one when it appears while a label is
free; every RELABEL_S the busiest (most service in the window, ties kept by the holders) take
them. A labelled client's series counts from when it got its label (its `baseline`), so every
series only grows while it exists, and all series always sum to the total: when a client loses
its label (it expired, or others were busier) what it was counted moves into "other", which then
grows; when it gets one, "other" keeps what it had counted, and the new series starts at 0, as a
new Prometheus child does. A client named "other" is never labelled (it is part of "other").
"""

from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from heapq import nlargest

from slora_vtc.cost import LinearCost
from slora_vtc.request import State

OTHER = "other"
RELABEL_S = 10.0  # how often the busiest clients may take labels from others
WINDOW_S = 60  # service rates (shares, Jain's index) over the last this many seconds, whole seconds
SERVICE = LinearCost()  # service as the server's VTC charges it: h(x, y) = x + 2 y
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
FINISH_REASONS = ("stop", "length", "abort", "rejected")


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


@dataclass
class ClientStats:
    """One client's requests, served tokens and latencies (engine thread only)."""

    admitted: int = 0  # accepted by the scheduler at arrival
    rejected: int = 0  # refused at arrival (rate limit, shutdown)
    finished: int = 0
    aborted: int = 0  # client disconnected, shutdown, model failure
    stopped: int = 0  # finished at a stop token (finish reason "stop"; the others: "length")
    input_tokens: int = 0  # prompts prefilled (each request once)
    cached_input_tokens: int = 0  # of those, served from the prefix cache at the first prefill
    output_tokens: int = 0  # tokens generated
    time_to_first_token: Histogram = field(default_factory=_latency)
    latency: Histogram = field(default_factory=_latency)  # arrival to the end, finished requests
    queue_time: Histogram = field(default_factory=_latency)  # arrival to the first admission
    token_gap: Histogram = field(
        default_factory=lambda: Histogram(TOKEN_GAP_BUCKETS)
    )  # between two tokens of a request
    live: int = 0  # requests submitted and not ended (not a metric: what makes the client idle)

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

    @property
    def reasons(self) -> dict[str, int]:
        """Requests by finish reason."""
        return {
            "stop": self.stopped,
            "length": self.finished - self.stopped,
            "abort": self.aborted,
            "rejected": self.rejected,
        }

    def copy(self) -> "ClientStats":
        return self.combined(ClientStats(), 1)

    def combined(self, other: "ClientStats", sign: int) -> "ClientStats":
        """self + sign * other, field by field."""
        values = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            values[f.name] = mine.combined(theirs, sign) if isinstance(mine, Histogram) else mine + sign * theirs
        return replace(self, **values)


class Counting:
    """A client's stats where a write also adds its difference to the total's (reads are the client's)."""

    __slots__ = ("_mine", "_total")

    def __init__(self, mine: ClientStats, total: ClientStats):
        object.__setattr__(self, "_mine", mine)
        object.__setattr__(self, "_total", total)

    def __getattr__(self, name: str):
        return getattr(self._mine, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._total, name, getattr(self._total, name) + value - getattr(self._mine, name))
        setattr(self._mine, name, value)


class ServiceWindow:
    """Each client's service in the last WINDOW_S seconds (1 s buckets), with the sums that Jain's
    index needs kept up to date, so that reading it costs O(1) however many clients there are.

    Active clients: those served in the window, and those with a request in the server now."""

    def __init__(self, window_s: int = WINDOW_S):
        self.window_s = window_s
        self.service: dict[str, float] = {}  # clients served in the window -> how much
        self.total = 0.0
        self.total_sq = 0.0  # sum of squares of `service`
        self._buckets: deque[tuple[int, dict[str, float]]] = deque()
        self._live: set[str] = set()
        self._live_unserved = 0  # live clients not in `service`

    @property
    def active(self) -> int:
        return len(self.service) + self._live_unserved

    def jain(self) -> float:
        """(sum x)^2 / (n sum x^2) over the active clients' service rates; NaN when none was served."""
        if not self.total_sq:
            return float("nan")
        return self.total * self.total / (self.active * self.total_sq)

    def add(self, client: str, amount: float, now: float) -> None:
        if not amount:
            return
        self.advance(now)
        second = int(now)
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append((second, {}))
        bucket = self._buckets[-1][1]
        bucket[client] = bucket.get(client, 0.0) + amount
        self._change(client, amount)

    def advance(self, now: float) -> None:
        """Drop the buckets older than the window."""
        oldest = int(now) - self.window_s
        while self._buckets and self._buckets[0][0] <= oldest:
            for client, amount in self._buckets.popleft()[1].items():
                self._change(client, -amount)

    def set_live(self, client: str, live: bool) -> None:
        if live == (client in self._live):
            return
        (self._live.add if live else self._live.discard)(client)
        if client not in self.service:
            self._live_unserved += 1 if live else -1

    def _change(self, client: str, amount: float) -> None:
        before = self.service.get(client, 0.0)
        after = before + amount
        self.total += amount
        self.total_sq += after * after - before * before
        if before == 0 and client in self._live:
            self._live_unserved -= 1
        if after == 0:
            del self.service[client]
            if client in self._live:
                self._live_unserved += 1
        else:
            self.service[client] = after


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
    pool_used: int
    adapters_resident: int


class ServerStats:
    """Every client's ClientStats, the total, the labels, the service window, and the idle clients
    in the order they went idle (engine thread only; `now`: the engine clock)."""

    def __init__(self, max_labels: int = 100, now: Callable[[], float] = lambda: 0.0, window_s: int = WINDOW_S):
        self.max_labels = max_labels
        self.now = now
        self.idle: OrderedDict[str, float] = OrderedDict()  # client -> since when, oldest first
        self.clients: dict[str, ClientStats] = {}
        self.total = ClientStats()
        self.window = ServiceWindow(window_s)
        self.labels: dict[str, ClientStats] = {}  # labelled client -> its numbers when it got the label
        self.forgotten = 0
        self._relabelled_at = float("-inf")

    def __getitem__(self, client: str) -> "Counting":
        """`stats[client].field += n`: counts n for the client (made if new) and in the total."""
        return Counting(*self.both(client))

    def __contains__(self, client: str) -> bool:
        return client in self.clients

    def both(self, client: str) -> tuple[ClientStats, ClientStats]:
        """The client's stats (made if new) and the total: every event updates both."""
        stats = self.clients.get(client)
        if stats is None:
            stats = self.clients[client] = ClientStats()
            self.idle[client] = self.now()  # idle until a request of it enters (a refusal before may count it)
            if len(self.labels) < self.max_labels and client != OTHER:
                self.labels[client] = ClientStats()
        return stats, self.total

    def begin(self, client: str) -> bool:
        """A request of this client entered the server; True if the client was idle."""
        stats, total = self.both(client)
        stats.live += 1
        total.live += 1
        self.idle.pop(client, None)
        self.window.set_live(client, True)
        return stats.live == 1

    def end(self, client: str) -> bool:
        """A request of this client left the server; True if the client is idle now."""
        stats, total = self.both(client)
        stats.live -= 1
        total.live -= 1
        if stats.live == 0:
            self.window.set_live(client, False)
            self.idle[client] = self.now()
        return stats.live == 0

    def until_due(self, idle_s: float) -> float | None:
        """Seconds until the oldest idle client is due (None: nobody is idle)."""
        if not self.idle:
            return None
        return max(0.0, next(iter(self.idle.values())) + idle_s - self.now())

    def due(self, idle_s: float) -> list[str]:
        """Forget the clients idle for idle_s or longer (the total keeps their numbers); their names."""
        now, due = self.now(), []
        while self.idle:
            client, since = next(iter(self.idle.items()))
            if since + idle_s > now:
                break
            del self.idle[client]
            self.forget(client)
            due.append(client)
        return due

    def remind(self, client: str) -> None:
        """Put a forgotten client back in line (its scheduler state may go after another idle period)."""
        self.idle[client] = self.now()

    def served(self, client: str, input_tokens: int, cached: int, output_tokens: int, now: float) -> None:
        for stats in self.both(client):
            stats.served(input_tokens, output_tokens)
            stats.cached_input_tokens += cached
        self.window.add(client, SERVICE(input_tokens, output_tokens), now)

    def forget(self, client: str) -> None:
        """Drop an idle client's own numbers (the total keeps them)."""
        if self.clients.pop(client, None) is not None:
            self.labels.pop(client, None)
            self.forgotten += 1

    def relabel(self, now: float) -> None:
        """Every RELABEL_S: give free labels to unlabelled clients, the busiest in the window first;
        when all are taken, a client busier than a holder takes the label of the least busy."""
        if now - self._relabelled_at < RELABEL_S or len(self.labels) == len(self.clients):
            return
        self._relabelled_at = now
        self.window.advance(now)
        service = self.window.service
        candidates = (
            (set(service) | set(self.labels)) & set(self.clients)
            if len(self.clients) > self.max_labels
            else set(self.clients)
        )
        candidates.discard(OTHER)
        chosen = nlargest(self.max_labels, candidates, key=lambda c: (service.get(c, 0.0), c in self.labels, c))
        for client in set(self.labels) - set(chosen):
            del self.labels[client]
        for client in chosen:
            if client not in self.labels:
                self.labels[client] = replace(self.clients[client].copy(), live=0)  # `live` is a level, not a count

    def labelled(self) -> dict[str, ClientStats]:
        """The labelled clients' numbers since they got their label, and OTHER: the total minus them."""
        shown = {client: self.clients[client].combined(base, -1) for client, base in self.labels.items()}
        other = self.total
        for stats in shown.values():
            other = other.combined(stats, -1)
        return {**shown, OTHER: other}

    def shares(self, now: float) -> dict[str, float]:
        self.window.advance(now)
        total, service = self.window.total, self.window.service
        if not total:
            return {}
        shares = {client: service.get(client, 0.0) / total for client in self.labels}
        return {**shares, OTHER: max(0.0, 1.0 - sum(shares.values()))}
