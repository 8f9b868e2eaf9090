"""First come, first served."""

from collections import Counter, deque

from slora_vtc.memory.admission import Budget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler, requeue


class FCFS(Scheduler):
    """Arrival order; stops at the first request that does not fit (head-of-line).

    A preempted request goes back in arrival order (so ahead of everything that arrived after
    it); the victim is the default, the latest arrival.
    """

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

    def heads_while_decoding(
        self, running: list[Request], steps: int, budget: Budget
    ) -> list[tuple[int, Request]] | None:
        if type(self).select is not FCFS.select or not self._queue:  # a subclass with its own order says for itself
            return None
        return [(0, self._queue[0])]  # the queue does not move while nothing arrives or is admitted

    def on_preempt(self, req: Request, now: float) -> None:
        requeue(self._queue, req)

    def num_waiting(self) -> int:
        return len(self._queue)

    def drain(self) -> list[Request]:
        drained, self._queue = list(self._queue), deque()
        return drained

    def waiting_by_client(self) -> dict[str, int]:
        return dict(Counter(r.client for r in self._queue))

    def remove(self, req: Request) -> bool:
        try:
            self._queue.remove(req)
        except ValueError:
            return False
        return True
