"""Longest prefix match (SGLang's `lpm` policy): the most cached prompt first, for locality, not fairness."""

from collections import deque

from slora_vtc.memory.admission import Budget
from slora_vtc.request import Request
from slora_vtc.sched.fcfs import FCFS


def by_longest_prefix(waiting: deque[Request], budget: Budget) -> list[tuple[Request, int]]:
    """Waiting requests (in arrival order) with their cached prefix, longest first; ties keep
    arrival order (the sort is stable)."""
    return sorted(((req, budget.cached_len(req)) for req in waiting), key=lambda pair: -pair[1])


class LPM(FCFS):
    """Each round, admit waiting requests in order of `budget.cached_len`, longest first, and
    stop at the first that does not fit, as SGLang does when its batch is full (and as every
    scheduler here does: no skipping ahead to a smaller request).

    With `fcfs_above = N`, a queue longer than N is served in arrival order instead (SGLang's
    fallback at 128, which bounds the cost of matching every waiting request each round); None
    (plain `lpm`) never falls back. A preempted request goes back in arrival order, and its
    prompt and generated tokens are then cached, so it usually comes first; the victim is the
    default, the latest arrival.
    """

    def __init__(self, fcfs_above: int | None = None):
        super().__init__()  # the waiting requests in arrival order
        self.fcfs_above = fcfs_above

    def select(self, budget: Budget, now: float) -> list[Request]:
        if self.fcfs_above is not None and len(self._queue) > self.fcfs_above:
            return super().select(budget, now)
        admitted = []
        for req, _ in by_longest_prefix(self._queue, budget):
            if not budget.try_add(req):
                break
            admitted.append(req)
        chosen = {id(req) for req in admitted}
        self._queue = deque(req for req in self._queue if id(req) not in chosen)
        return admitted

    def heads_while_decoding(
        self, running: list[Request], steps: int, budget: Budget
    ) -> list[tuple[int, Request]] | None:
        """Matches change only when the tree does, and decode steps that evict nothing leave it alone."""
        if type(self).select is not LPM.select or not self._queue:
            return None
        if self.fcfs_above is not None and len(self._queue) > self.fcfs_above:
            return [(0, self._queue[0])]
        return [(0, by_longest_prefix(self._queue, budget)[0][0])]
