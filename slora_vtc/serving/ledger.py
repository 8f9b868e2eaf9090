"""One per-client ledger for the server and the gateway: service, requests by outcome, idle expiry,
and the bounded client labels of /metrics (docs/design.md, "Serving").

Every number is kept twice: in the client's own record and in `total` (every client ever,
forgotten ones included), so totals add up whatever expires, and the aggregate client="other" is
the total minus the labelled clients, without visiting the others. A record is a Tally; a user
of the ledger adds its own numbers in a subclass (the server its tokens and latency histograms,
the gateway its requests in flight), kept the same way.

Outcomes: every request that enters ends in exactly one of OUTCOMES, the words of both /metrics:
  finished  served to its end (a stop token or string, or its max_tokens)
  aborted   its client went away, or a shutdown cancelled it; it keeps what it was charged
  failed    what serves it failed: the model or the engine (server), the upstream (gateway, which
            refunds it)
  rejected  refused at arrival (rate limit, full queue, shutting down), or by the upstream (gateway)

Idle clients: a client with no request in the system is idle (one only ever refused too); after
`idle_s` idle it is forgotten: its own record goes, the total keeps its numbers, and the caller's
`forget` (the scheduler's) drops what it can, asked again after another idle period where it keeps
something. The idle clients are kept in the order they went idle, so expiry is O(1) while nothing
is due.

Labels (at most `max_labels` clients by name): a client gets one when it first appears while a
label is free; every RELABEL_S the busiest (most service in the window, ties kept by the holders)
take them. A labelled client's series counts from when it got its label (its baseline), so every
series only grows while it exists, and all series always sum to the total: when a client loses its
label (it expired, or others were busier) what it was counted moves into "other", which then grows;
when it gets one, "other" keeps what it had counted, and the new series starts at 0, as a new
Prometheus child does. Levels (requests in the system now, in flight) are not counted from a point
on: a labelled client shows its own, "other" the rest. A client named "other" is never labelled
(it is part of "other").
"""

from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from heapq import nlargest
from typing import ClassVar, Generic, TypeVar

from slora_vtc.serving.window import WINDOW_S, ServiceWindow

OUTCOMES = ("finished", "aborted", "failed", "rejected")
OTHER = "other"
MAX_LABELS = 100  # clients named in /metrics' client label; the rest are summed under "other"
RELABEL_S = 10.0  # how often the busiest clients may take labels from others

T = TypeVar("T", bound="Tally")


@dataclass
class Tally:
    """One client's numbers (or the total's): service delivered, requests by outcome, requests in
    the system now. Subclasses add fields: numbers (int, float, or anything with `combined`) that
    only grow, and levels (listed in LEVELS) that go up and down."""

    LEVELS: ClassVar[tuple[str, ...]] = ("live",)

    service: float = 0.0  # h(prompt, output tokens) of what was delivered (the gateway refunds a failure's)
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    rejected: int = 0
    live: int = 0  # requests in the system, waiting or running (the client is idle at 0)

    @property
    def outcomes(self) -> Counter:
        """Requests by outcome (those with none left out)."""
        return Counter({outcome: n for outcome in OUTCOMES if (n := getattr(self, outcome))})

    def combined(self: T, other: T, sign: int) -> T:
        """self + sign * other, field by field."""
        values = {}
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            values[f.name] = mine + sign * theirs if isinstance(mine, int | float) else mine.combined(theirs, sign)
        return replace(self, **values)

    def baseline(self: T) -> T:
        """What a series counts from when the client gets its label: a copy, its levels at 0."""
        return replace(self.combined(type(self)(), 1), **{level: 0 for level in self.LEVELS})


class Counting:
    """A client's record where a write also adds its difference to the total's (reads are the client's)."""

    __slots__ = ("_mine", "_total")

    def __init__(self, mine: Tally, total: Tally):
        object.__setattr__(self, "_mine", mine)
        object.__setattr__(self, "_total", total)

    def __getattr__(self, name: str):
        return getattr(self._mine, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._total, name, getattr(self._total, name) + value - getattr(self._mine, name))
        setattr(self._mine, name, value)


class ClientLedger(Generic[T]):
    """Every client's record, the total, the labels, the service window, and the idle clients in the
    order they went idle. One thread only (the server's engine thread, the gateway's event loop);
    `now`: that thread's clock."""

    def __init__(
        self,
        record: Callable[[], T] = Tally,
        max_labels: int = MAX_LABELS,
        now: Callable[[], float] = lambda: 0.0,
        window_s: int = WINDOW_S,
    ):
        self.record, self.max_labels, self.now = record, max_labels, now
        self.clients: dict[str, T] = {}
        self.total: T = record()
        self.window = ServiceWindow(window_s)
        self.labels: dict[str, T] = {}  # labelled client -> its record when it got the label
        self.idle: OrderedDict[str, float] = OrderedDict()  # client -> idle since, oldest first
        self.forgotten = 0  # clients forgotten after being idle
        self._relabelled_at = float("-inf")

    # -- counting ----------------------------------------------------------------------------------
    def __getitem__(self, client: str) -> Counting:
        """`ledger[client].field += n`: counts n for the client (made if new) and in the total."""
        return Counting(*self.both(client))

    def __contains__(self, client: str) -> bool:
        return client in self.clients

    def both(self, client: str) -> tuple[T, T]:
        """The client's record (made if new) and the total: every event updates both."""
        mine = self.clients.get(client)
        if mine is None:
            mine = self.clients[client] = self.record()
            self._idle_since(client)  # idle until a request of it enters (a refusal before may count it)
            if len(self.labels) < self.max_labels and client != OTHER:
                self.labels[client] = self.record()
        return mine, self.total

    def serve(self, client: str, amount: float, now: float) -> None:
        """The client was delivered `amount` of service (negative: a refund). Once per streamed token
        in the gateway: kept short."""
        mine = self.clients.get(client) or self.both(client)[0]
        mine.service += amount
        self.total.service += amount
        self.window.add(client, amount, now)

    # -- requests: begin, end, refused -------------------------------------------------------------
    def begin(self, client: str) -> bool:
        """A request of the client entered the system; True if the client was idle."""
        for record in self.both(client):
            record.live += 1
        self.idle.pop(client, None)
        self.window.set_live(client, True)
        return self.clients[client].live == 1

    def end(self, client: str, outcome: str) -> bool:
        """A request that entered left it with `outcome` (OUTCOMES); True if the client is idle now."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r} (one of {', '.join(OUTCOMES)})")
        for record in self.both(client):
            setattr(record, outcome, getattr(record, outcome) + 1)
            record.live -= 1
        if self.clients[client].live:
            return False
        self.window.set_live(client, False)
        self._idle_since(client)
        return True

    def refuse(self, client: str) -> None:
        """A request of the client was refused before it entered (counted as rejected)."""
        for record in self.both(client):
            record.rejected += 1
        if not self.clients[client].live:
            self._idle_since(client)  # it is still calling: its idle time starts again

    # -- idle clients ------------------------------------------------------------------------------
    def _idle_since(self, client: str) -> None:
        self.idle[client] = self.now()
        self.idle.move_to_end(client)

    def until_due(self, idle_s: float) -> float | None:
        """Seconds until the oldest idle client is due (None: nobody is idle)."""
        if not self.idle:
            return None
        return max(0.0, next(iter(self.idle.values())) + idle_s - self.now())

    def expire(self, idle_s: float, forget: Callable[[str, float], bool]) -> list[str]:
        """Forget the clients idle for `idle_s` or longer (their numbers stay in the total) and call
        `forget(client, now)` for each (the scheduler's); one that answers False (it kept some state)
        is asked again after another idle period. The clients forgotten, oldest first."""
        now, due = self.now(), []
        while self.idle:
            client, since = next(iter(self.idle.items()))
            if since + idle_s > now:
                break
            del self.idle[client]
            self.forget(client)
            due.append(client)
        for client in due:
            if not forget(client, now):
                self._idle_since(client)
        return due

    def forget(self, client: str) -> None:
        """Drop a client's own numbers (the total keeps them)."""
        if self.clients.pop(client, None) is not None:
            self.labels.pop(client, None)
            self.forgotten += 1

    # -- labels ------------------------------------------------------------------------------------
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
                self.labels[client] = self.clients[client].baseline()

    def labelled(self) -> dict[str, T]:
        """The labelled clients' numbers since they got their label, and OTHER: the total minus them."""
        shown = {client: self.clients[client].combined(base, -1) for client, base in self.labels.items()}
        other = self.total
        for record in shown.values():
            other = other.combined(record, -1)
        return {**shown, OTHER: other}
