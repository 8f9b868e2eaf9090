"""A scheduler registered from outside the package: clients take turns (docs/extending.md).

    slora-vtc --plugin examples/plugins/round_robin.py run --suite overload --scheduler rr

Round robin over clients counts requests, not tokens: it is fair only while every request costs
the same, which is what VTC's token counters fix.
"""

from collections import deque

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched import Entry, Scheduler, register_scheduler


class RoundRobin(Scheduler):
    """One request per client per turn, clients in the order they started waiting. `select` (the
    core's loop over peek and pop) stops at the first request that does not fit (head-of-line)."""

    def __init__(self):
        self._queues: dict[str, deque[Request]] = {}
        self._turns: deque[str] = deque()  # clients with waiting requests, the next one first

    def on_arrival(self, req: Request, now: float) -> bool:
        queue = self._queues.setdefault(req.client, deque())
        if not queue:
            self._turns.append(req.client)
        queue.append(req)
        return True

    def peek(self, budget: AdmissionBudget) -> Request | None:
        return self._queues[self._turns[0]][0] if self._turns else None

    def pop(self, req: Request, now: float) -> None:
        client = self._turns.popleft()
        self._queues[client].popleft()
        if self._queues[client]:
            self._turns.append(client)

    def num_waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def waiting_by_client(self) -> dict[str, int]:
        return {client: len(q) for client, q in self._queues.items()}

    def drain(self) -> list[Request]:
        drained = [req for q in self._queues.values() for req in q]
        self._queues.clear()
        self._turns.clear()
        return drained

    def remove(self, req: Request) -> bool:
        queue = self._queues.get(req.client)
        if queue is None or req not in queue:
            return False
        queue.remove(req)
        if not queue:
            self._turns.remove(req.client)
        return True


register_scheduler(
    "rr", Entry(lambda arg, clients, options: RoundRobin(), "round robin over clients, one request per turn (a plugin)")
)
