"""Longest prefix match (SGLang's `lpm` policy): the most cached prompt first, for locality, not fairness."""

from collections import deque

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched.base import Traits
from slora_vtc.sched.fcfs import FCFS


def by_longest_prefix(waiting: deque[Request], budget: AdmissionBudget) -> list[tuple[Request, int]]:
    """Waiting requests (in arrival order) with their cached prefix, longest first; ties keep
    arrival order (the sort is stable)."""
    return sorted(((req, budget.cached_len(req)) for req in waiting), key=lambda pair: -pair[1])


class Round:
    """The waiting requests in one round's order, decided at its first peek: what the prefix cache
    holds does not change within a round (admitted requests are prefilled after it)."""

    def __init__(self, budget: AdmissionBudget, order: list[tuple[Request, int]]):
        self.budget, self.order = budget, order
        self.taken: set[int] = set()  # ids of the requests popped this round
        self.cursor = 0  # nothing before it can come next

    def candidates(self):
        """(index, request, cached length) of the requests not yet taken, from the cursor on."""
        for i in range(self.cursor, len(self.order)):
            req, cached = self.order[i]
            if id(req) not in self.taken:
                yield i, req, cached


class LPM(FCFS):
    """Each round, admit waiting requests in order of `budget.cached_len`, longest first, and
    stop at the first that does not fit, as SGLang does when its batch is full (and as every
    scheduler here does: no skipping ahead to a smaller request).

    With `fcfs_above = N`, a queue longer than N at the start of a round is served in arrival order
    instead (SGLang's fallback at 128, which bounds the cost of matching every waiting request each
    round); None (plain `lpm`) never falls back. A preempted request goes back in arrival order, and
    its prompt and generated tokens are then cached, so it usually comes first; the victim is the
    default, the latest arrival.
    """

    traits = Traits(needs_token_ids=True, preemption=True, lookahead=True)

    def __init__(self, fcfs_above: int | None = None):
        super().__init__()  # the waiting requests in arrival order
        self.fcfs_above = fcfs_above
        self._round: Round | None = None

    def _falls_back(self) -> bool:
        return self.fcfs_above is not None and len(self._queue) > self.fcfs_above

    def round(self, budget: AdmissionBudget) -> Round:
        """This round's order (a new round when the budget is new, or the queue changed otherwise than by pop)."""
        if self._round is None or self._round.budget is not budget:
            order = [(req, 0) for req in self._queue] if self._falls_back() else by_longest_prefix(self._queue, budget)
            self._round = Round(budget, order)
        return self._round

    def peek(self, budget: AdmissionBudget) -> Request | None:
        r = self.round(budget)
        for i, req, _ in r.candidates():
            r.cursor = i
            return req
        return None

    def pop(self, req: Request, now: float) -> None:
        if self._round is not None:
            self._round.taken.add(id(req))
        self._queue.remove(req)

    def on_arrival(self, req: Request, now: float) -> bool:
        self._round = None
        return super().on_arrival(req, now)

    def on_preempt(self, req: Request, now: float) -> None:
        self._round = None
        super().on_preempt(req, now)

    def remove(self, req: Request) -> bool:
        self._round = None
        return super().remove(req)

    def drain(self) -> list[Request]:
        self._round = None
        return super().drain()

    def heads(self, running: list[Request], steps: int, budget: AdmissionBudget) -> list[tuple[int, Request]] | None:
        """Matches change only when the tree does, and decode steps that evict nothing leave it alone."""
        if type(self).peek is not LPM.peek or not self._queue:
            return None
        if self._falls_back():
            return [(0, self._queue[0])]
        return [(0, by_longest_prefix(self._queue, budget)[0][0])]
