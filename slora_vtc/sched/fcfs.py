"""First come, first served."""

from collections import Counter, deque

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler, Traits, requeue
from slora_vtc.sched.lookahead import LookAhead


class FCFS(Scheduler, LookAhead):
    """Arrival order; stops at the first request that does not fit (head-of-line).

    A preempted request goes back in arrival order (so ahead of everything that arrived after
    it); the victim is the default, the latest arrival. It charges nothing, so any number of
    decode steps are charged at once, and the head of its queue does not move while it decodes.
    """

    traits = Traits(preemption=True, lookahead=True)

    def __init__(self):
        self._queue: deque[Request] = deque()

    def on_arrival(self, req: Request, now: float) -> bool:
        self._queue.append(req)
        return True

    def peek(self, budget: AdmissionBudget) -> Request | None:
        return self._queue[0] if self._queue else None

    def pop(self, req: Request, now: float) -> None:
        self._queue.popleft()

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

    # -- look-ahead (macro-steps) -------------------------------------------------------------------
    def charge_steps(self, running: list[Request], steps: int, now: float) -> bool:
        return type(self).on_decode_step is FCFS.on_decode_step  # a subclass that charges says for itself

    def heads(self, running: list[Request], steps: int, budget: AdmissionBudget) -> list[tuple[int, Request]] | None:
        if type(self).peek is not FCFS.peek or not self._queue:  # a subclass with its own order says for itself
            return None
        return [(0, self._queue[0])]  # the queue does not move while nothing arrives or is admitted

    def queues_behind(self, req: Request) -> bool:
        own_rules = type(self).on_arrival is FCFS.on_arrival and type(self).peek is FCFS.peek
        return own_rules and bool(self._queue)  # behind the head, which stays
