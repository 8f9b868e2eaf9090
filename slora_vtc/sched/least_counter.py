"""VTC's waiting clients, the least served first: a heap keyed by (counter, registration order)."""

import heapq
import itertools
from collections import deque
from dataclasses import dataclass


@dataclass
class Client:
    order: int  # registration order: ties go to the earlier client, as in the artifact
    counter: float = 0.0
    weight: float = 1.0
    version: int = 0  # the stamp of its latest heap entry; older entries are stale
    queue: deque | None = None  # its waiting requests, oldest first


class LeastCounter:
    """The waiting client with the smallest counter in O(log clients). A client is pushed when it
    starts waiting and whenever its counter falls; entries of a client that stopped waiting or was
    pushed again are dropped when they surface, and one whose counter grew since is re-keyed then
    (counters only grow between pushes, so a surfacing entry is never too large)."""

    def __init__(self):
        self._heap: list[tuple[float, int, int, str]] = []
        self._stamps = itertools.count(1)  # entry versions, never reused (a forgotten client's entries stay stale)

    def push(self, name: str, c: Client) -> None:
        c.version = next(self._stamps)
        heapq.heappush(self._heap, (c.counter, c.order, c.version, name))

    def least(self, clients: dict[str, Client]) -> str | None:
        heap = self._heap
        while heap:
            counter, _, version, name = heap[0]
            c = clients.get(name)
            if c is None or version != c.version or not c.queue:
                heapq.heappop(heap)
            elif counter != c.counter:
                heapq.heapreplace(heap, (c.counter, c.order, c.version, name))
            else:
                return name
        return None

    def clear(self) -> None:
        self._heap.clear()
