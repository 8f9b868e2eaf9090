"""First come, first served, and the request-per-minute rate limit on top of it."""

from collections import defaultdict, deque

from slora_vtc.memory.admission import Budget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler

RPM_WINDOW_S = 60.0


class FCFS(Scheduler):
    """Arrival order; stops at the first request that does not fit (head-of-line)."""

    def __init__(self):
        self._queue: deque[Request] = deque()

    def on_arrival(self, req: Request, now: float) -> bool:
        self._queue.append(req)
        return True

    def select(self, budget: Budget, now: float) -> list[Request]:
        admitted = []
        while self._queue and budget.try_add(self._queue[0]):
            admitted.append(self._queue.popleft())
        return admitted

    def num_waiting(self) -> int:
        return len(self._queue)

    def drain(self) -> list[Request]:
        drained, self._queue = list(self._queue), deque()
        return drained

    def remove(self, req: Request) -> bool:
        try:
            self._queue.remove(req)
        except ValueError:
            return False
        return True


class RPM(FCFS):
    """Rejects a client's request when it already had `limit` accepted arrivals in the last 60 s."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit
        self._accepted: dict[str, deque[float]] = defaultdict(deque)

    def on_arrival(self, req: Request, now: float) -> bool:
        recent = self._accepted[req.client]
        while recent and recent[0] <= now - RPM_WINDOW_S:
            recent.popleft()
        if len(recent) >= self.limit:
            return False
        recent.append(now)
        return super().on_arrival(req, now)
