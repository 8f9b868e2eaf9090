"""Request-per-minute limits: per client, in front of any scheduler; RPM is FCFS behind one limit."""

from collections import defaultdict, deque
from collections.abc import Mapping

from slora_vtc.memory.admission import Budget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler
from slora_vtc.sched.fcfs import FCFS

RPM_WINDOW_S = 60.0


class RateLimited(Scheduler):
    """Rejects a request at arrival when its client already had `limit` accepted arrivals in the
    last 60 s (as RPM does); everything else is delegated to `inner`, unchanged.

    Limits are per client (`default` for clients not named, None: unlimited) and any scheduler
    can sit underneath, VTC included. Forgetting a client drops its window once every arrival in
    it is older than 60 s (it would count none of them any more), and asks `inner` to forget it.
    """

    def __init__(self, inner: Scheduler, limits: Mapping[str, int], default: int | None = None):
        self.inner = inner
        self.limits = dict(limits)
        self.default = default
        self._accepted: dict[str, deque[float]] = defaultdict(deque)

    def limit_of(self, client: str) -> int | None:
        return self.limits.get(client, self.default)

    def on_arrival(self, req: Request, now: float) -> bool:
        limit = self.limit_of(req.client)
        if limit is not None and self._recent(req.client, now) >= limit:
            return False
        if not self.inner.on_arrival(req, now):
            return False
        if limit is not None:
            self._accepted[req.client].append(now)
        return True

    def _recent(self, client: str, now: float) -> int:
        recent = self._accepted[client]
        while recent and recent[0] <= now - RPM_WINDOW_S:
            recent.popleft()
        return len(recent)

    # -- everything else is the inner scheduler's -------------------------------------------
    def select(self, budget: Budget, now: float) -> list[Request]:
        return self.inner.select(budget, now)

    def num_waiting(self) -> int:
        return self.inner.num_waiting()

    def drain(self) -> list[Request]:
        return self.inner.drain()

    def on_decode_step(self, running: list[Request], now: float) -> None:
        self.inner.on_decode_step(running, now)

    def on_decode_steps(self, running: list[Request], steps: int, now: float) -> bool:
        return self.inner.on_decode_steps(running, steps, now)

    def heads_while_decoding(
        self, running: list[Request], steps: int, budget: Budget
    ) -> list[tuple[int, Request]] | None:
        return self.inner.heads_while_decoding(running, steps, budget)  # the limit acts at arrival only

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> None:
        self.inner.on_finish(finished, batch, now)

    def on_abort(self, req: Request, now: float) -> None:
        self.inner.on_abort(req, now)

    def remove(self, req: Request) -> bool:
        return self.inner.remove(req)

    def on_preempt(self, req: Request, now: float) -> None:
        self.inner.on_preempt(req, now)

    def choose_victim(self, running: list[Request], now: float) -> Request:
        return self.inner.choose_victim(running, now)

    @property
    def supports_preemption(self) -> bool:
        return self.inner.supports_preemption

    def waiting_by_client(self) -> dict[str, int]:
        return self.inner.waiting_by_client()

    def counters(self) -> dict[str, float]:
        return self.inner.counters()

    def counter_of(self, client: str) -> float | None:
        return self.inner.counter_of(client)

    def weight_of(self, client: str) -> float:
        return self.inner.weight_of(client)

    def adjust(self, client: str, delta: float) -> None:
        self.inner.adjust(client, delta)

    def forget(self, client: str, now: float) -> bool:
        if client in self._accepted:
            if self._recent(client, now):
                self.inner.forget(client, now)
                return False  # arrivals still in the window: ask again later
            del self._accepted[client]
        return self.inner.forget(client, now)


class RPM(RateLimited):
    """The paper's rate-limit baseline: FCFS, rejecting a client's request when it already had
    `limit` accepted arrivals in the last 60 s (rejected, not delayed)."""

    def __init__(self, limit: int):
        super().__init__(FCFS(), {}, default=limit)
        self.limit = limit
