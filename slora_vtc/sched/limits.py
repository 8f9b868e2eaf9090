"""Request-per-minute limits: per client, in front of any scheduler; RPM is FCFS behind one limit."""

from collections import OrderedDict, deque
from collections.abc import Mapping

from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler
from slora_vtc.sched.delegating import Delegating
from slora_vtc.sched.fcfs import FCFS

RPM_WINDOW_S = 60.0


class RateLimited(Delegating):
    """Rejects a request at arrival when its client already had `limit` accepted arrivals in the
    last 60 s (as RPM does); everything else is the inner scheduler's, unchanged.

    Limits are per client (`default` for clients not named, None: unlimited) and any scheduler can
    sit underneath, VTC included. A client's window is dropped once its newest accepted arrival is
    60 s old (it would count none of them any more), so the windows follow the active clients.
    """

    def __init__(self, inner: Scheduler, limits: Mapping[str, int], default: int | None = None):
        super().__init__(inner)
        self.limits = dict(limits)
        self.default = default
        self._accepted: OrderedDict[str, deque[float]] = OrderedDict()  # by newest accepted arrival, oldest first

    def limit_of(self, client: str) -> int | None:
        return self.limits.get(client, self.default)

    def on_arrival(self, req: Request, now: float) -> bool:
        self._drop_expired(now)
        limit = self.limit_of(req.client)
        if limit is not None and self._recent(req.client, now) >= limit:
            return False
        if not self.inner.on_arrival(req, now):
            return False
        if limit is not None:
            self._accepted.setdefault(req.client, deque()).append(now)
            self._accepted.move_to_end(req.client)
        return True

    def queues_behind(self, req: Request) -> bool:
        """The inner scheduler's answer for a client without a limit; with one, whether the limit
        accepts an arrival depends on the arrivals before it, which a look ahead past them misses."""
        return self.inner.queues_behind(req) and self.limit_of(req.client) is None

    def _recent(self, client: str, now: float) -> int:
        recent = self._accepted.get(client)
        if recent is None:
            return 0
        while recent and recent[0] <= now - RPM_WINDOW_S:
            recent.popleft()
        return len(recent)

    def _drop_expired(self, now: float) -> None:
        while self._accepted:
            client, recent = next(iter(self._accepted.items()))
            if recent and recent[-1] > now - RPM_WINDOW_S:
                return
            del self._accepted[client]


class RPM(RateLimited):
    """The paper's rate-limit baseline: FCFS, rejecting a client's request when it already had
    `limit` accepted arrivals in the last 60 s (rejected, not delayed)."""

    def __init__(self, limit: int):
        super().__init__(FCFS(), {}, default=limit)
        self.limit = limit
