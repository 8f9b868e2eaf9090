"""Each client's service in the last WINDOW_S seconds: which clients are busiest now (the ledger's
labels go to them) and how evenly the active ones are served (Jain's index, the server's /metrics)."""

from collections import deque

WINDOW_S = 60  # service rates (shares, Jain's index, the busiest) over the last this many seconds, whole seconds


class ServiceWindow:
    """Each client's service in the last WINDOW_S seconds (1 s buckets), with the sums that Jain's
    index needs kept up to date, so that reading it costs O(1) however many clients there are.

    Active clients: those served in the window, and those with a request in the server now. A
    refund (the gateway's, for a failed request) counts in the second it is made."""

    def __init__(self, window_s: int = WINDOW_S):
        self.window_s = window_s
        # `service`, `total` and `total_sq` are as of the last `advance` (reading `active` or `jain()`
        # counts the current second in first): adding is two dict operations, once per streamed token
        self.service: dict[str, float] = {}  # clients served in the window -> how much
        self.total = 0.0
        self.total_sq = 0.0  # sum of squares of `service`
        self._buckets: deque[tuple[int, dict[str, float]]] = deque()  # counted in `service`, oldest first
        self._second: int | None = None  # the second being added to
        self._current: dict[str, float] = {}  # what it added, not yet counted in `service`
        self._live: set[str] = set()
        self._live_unserved = 0  # live clients not in `service`

    @property
    def active(self) -> int:
        self._count_current()
        return len(self.service) + self._live_unserved

    def jain(self) -> float:
        """(sum x)^2 / (n sum x^2) over the active clients' service rates; NaN when none was served."""
        active = self.active
        if not self.total_sq:
            return float("nan")
        return self.total * self.total / (active * self.total_sq)

    def add(self, client: str, amount: float, now: float) -> None:
        if not amount:
            return
        second = int(now)
        if second != self._second:
            self.advance(now)
            self._second = second
        current = self._current
        current[client] = current.get(client, 0.0) + amount

    def advance(self, now: float) -> None:
        """Count what was added in `service`, and drop the seconds older than the window."""
        self._count_current()
        oldest = int(now) - self.window_s
        while self._buckets and self._buckets[0][0] <= oldest:
            for client, amount in self._buckets.popleft()[1].items():
                self._change(client, -amount)

    def _count_current(self) -> None:
        if self._current:
            self._buckets.append((self._second, self._current))
            for client, amount in self._current.items():
                self._change(client, amount)
            self._current = {}

    def set_live(self, client: str, live: bool) -> None:
        if live == (client in self._live):
            return
        (self._live.add if live else self._live.discard)(client)
        if client not in self.service:
            self._live_unserved += 1 if live else -1

    def _change(self, client: str, amount: float) -> None:
        if not amount:  # a bucket where a refund cancelled what was served
            return
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
