"""A waiting queue of vLLM's shape in front of any scheduler: for a driver that only peeks at the next
request and pops it.

vLLM's scheduler keeps its waiting requests in a `RequestQueue` (add, peek, pop, prepend, remove):
its loop peeks at the head, decides whether it can run it now, and pops it if so. `PeekPopQueue`
gives a scheduler of ours that shape, so that such a loop drives it exactly as our engine's `select`
does (that loop is the same peek, try, pop); the driver then reports the service with the
scheduler's own events (`on_prefill` for what a step computes of a prompt, `on_decode_step`,
`on_finish`, `on_abort`). A preempted request is prepended (`Scheduler.on_preempt`: ahead of what
arrived after it).
"""

from collections.abc import Callable, Iterator

from slora_vtc.memory.budget import UNLIMITED, AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler


class PeekPopQueue:
    """The waiting requests of `scheduler`, in its order. `now` is the driver's clock; `budget` what
    `peek` may consult (the prefix cache's hits; the driver itself decides what fits)."""

    def __init__(self, scheduler: Scheduler, now: Callable[[], float], budget: AdmissionBudget = UNLIMITED):
        self.scheduler, self.now, self.budget = scheduler, now, budget
        self._members: dict[int, Request] = {}  # id -> request, in the order they came in (for iteration)

    def add_request(self, req: Request) -> bool:
        """A new request, at its arrival time (as the engine hands it in); False: the scheduler rejected
        it (a rate limit), and it is not queued."""
        if not self.scheduler.on_arrival(req, req.arrival):
            return False
        self._members[id(req)] = req
        return True

    def peek_request(self) -> Request:
        """The request the scheduler admits next; IndexError when nothing waits."""
        req = self.scheduler.peek(self.budget)
        if req is None:
            raise IndexError("peek from an empty queue")
        return req

    def pop_request(self) -> Request:
        """Take the request `peek_request` names out: it runs now."""
        req = self.peek_request()
        self.scheduler.pop(req, self.now())
        del self._members[id(req)]
        return req

    def prepend_request(self, req: Request) -> None:
        """A preempted request waits again, ahead of what arrived after it."""
        self.scheduler.on_preempt(req, self.now())
        self._members[id(req)] = req

    def remove_request(self, req: Request) -> bool:
        """Take a waiting request out for good (an abort); whether it was waiting."""
        if not self.scheduler.remove(req):
            return False
        del self._members[id(req)]
        return True

    def __len__(self) -> int:
        return self.scheduler.num_waiting()

    def __bool__(self) -> bool:
        return self.scheduler.num_waiting() > 0

    def __iter__(self) -> Iterator[Request]:
        """The waiting requests in the order they came in (not the scheduler's)."""
        return iter(list(self._members.values()))
