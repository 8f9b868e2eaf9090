"""Forgetting VTC's idle clients, exactly.

`VTC.forget` (for a client with nothing waiting or running) drops its record so that per-client
state follows the active clients, not every name ever seen. What it leaves behind is only what a
returning client needs to be treated exactly as if it had never been forgotten:
- its registration order (an int): ties go to the earlier client, and a lifted returner ties
  with the client whose counter lifted it, so this decides who goes first;
- its counter, unless the lift gives it back. A returner is registered with counter 0 and lifted
  to max(0, F), F the lift floor at its return; had it been kept it would get max(c, F). These
  agree when c = 0, and under Lift.PAPER when c <= F at every later return.
- if it was the last to leave the queue, its counter as it left: the floor of an arrival into an
  empty queue. It returns with that counter, the last to leave again until another client leaves,
  so that a lift on its return raises the floor as it would have had it never been forgotten.

The rule: without length prediction (no refunds) and without set_counter, every client that is
waiting or running, and the last to leave the queue, keeps a counter >= B = min(the floor now, the
counters of the clients now running, the last to leave's counter). Counters only grow; a lifted
arrival starts at >= the floor; the admitted (and a preempted one, back in the queue) were at >= B
already; removing a waiting request only shrinks the set. Once a client has left the queue there
always is a floor, so every later floor is >= B, and c <= B makes dropping c exact. Otherwise (c > B,
Lift.ARTIFACT or Lift.NONE where an idle client keeps its counter, refunds with a predictor, counters
overwritten by a router) the counter is kept: forget returns False only where a later call may
still drop it (c > B under those rules; B only grows). A predictor's own per-client state (vtc-avg's
moving averages) is kept too: a returner is predicted from it.

The orders of the last KEPT_ORDERS forgotten clients are kept; an older one returns as a new client,
so it loses the tie with the client whose counter lifted it (one request's order). A correction by
`adjust` (a gateway reconciling with what the upstream reports) keeps this exact when it raises a
counter; a refund lowers one, and then a client forgotten before may return to a floor below its old
counter, at most the refunds since below.
"""

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slora_vtc.sched.vtc import VTC

KEPT_ORDERS = 100_000  # registration orders of forgotten clients kept for their return


class IdleClients:
    """What VTC's forgotten clients leave behind (module docstring)."""

    def __init__(self):
        self.orders: OrderedDict[str, int] = OrderedDict()  # the latest KEPT_ORDERS forgotten clients -> their order
        self.kept: dict[str, float] = {}  # forgotten clients whose counter the lift would not give back -> it
        self.left_counter: float | None = None  # the last client to leave the queue, once forgotten: its counter
        self.left_name: str | None = None  # and its name: it comes back with that counter, the floor again
        self.overwritten = False  # set_counter was used: counters may fall, so forgetting keeps them

    def returning_order(self, name: str) -> int | None:
        return self.orders.pop(name, None)

    def returning_counter(self, name: str) -> float:
        kept = self.kept.pop(name, 0.0)
        return self.left_counter if name == self.left_name else kept

    def left_again(self) -> None:
        """A client left the queue (VTC.last_left names it): no forgotten one is the last to leave."""
        self.left_counter = self.left_name = None

    def forget(self, vtc: "VTC", client: str, recoverable: bool) -> bool:
        """Forget an idle client of `vtc`; `recoverable`: the lift gives back a counter <= B."""
        running = {record.client for record in vtc.records.values()}
        c = vtc.clients.get(client)
        if c is not None:
            if c.queue or client in running:
                return False  # not idle: the caller asked too early
            del vtc.clients[client]
            self.orders[client] = c.order
            if len(self.orders) > KEPT_ORDERS:
                self.orders.popitem(last=False)
            if vtc.last_left == client:
                vtc.last_left, self.left_counter, self.left_name = None, c.counter, client
            counter = c.counter
        elif client in self.kept:  # asked again: the bound may have risen
            counter = self.kept.pop(client)
        else:
            return True
        if counter == 0 or (
            recoverable and (bound := self.lowest_floor(vtc, running)) is not None and counter <= bound
        ):
            return True
        self.kept[client] = counter
        return not recoverable

    def lowest_floor(self, vtc: "VTC", running: set[str]) -> float | None:
        """B of the module docstring: no later floor is below it (None: there may be no floor,
        which is so until a client first leaves the queue: waiting clients may all be removed)."""
        floor = vtc.floor()
        if floor is None or (vtc.last_left is None and self.left_counter is None):
            return None
        left = self.left_counter if vtc.last_left is None else vtc.clients[vtc.last_left].counter
        return min([floor, *(vtc.clients[name].counter for name in running), *(() if left is None else (left,))])
