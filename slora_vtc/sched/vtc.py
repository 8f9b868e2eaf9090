"""Virtual Token Counter (paper section 4) and its variants: LCF, weighted, length prediction.

Forgetting an idle client (`VTC.forget`, for a client with nothing waiting or running) drops its
record so that per-client state follows the active clients, not every name ever seen. What it
leaves behind is only what a returning client needs to be treated exactly as if it had never
been forgotten:
- its registration order (an int): ties go to the earlier client, and a lifted returner ties
  with the client whose counter lifted it, so this decides who goes first;
- its counter, unless the lift gives it back. A returner is registered with counter 0 and lifted
  to max(0, F), F the lift floor at its return; had it been kept it would get max(c, F). These
  agree when c = 0, and under Lift.PAPER when c <= F at every later return. Without length
  prediction (no refunds) and without set_counter, every client that is waiting or running, and
  the last to leave the queue, keeps a counter >= B = min(the floor now, the counters of the
  clients now running, the last to leave's counter): counters only grow, a lifted arrival
  starts at >= the floor, the admitted (and a preempted one, back in the queue) were at >= B
  already, removing a waiting request only shrinks the set. Once a client has left the queue
  there always is a floor, so every later floor is >= B, and c <= B makes dropping c exact. Otherwise (c > B,
  Lift.ARTIFACT or Lift.NONE where an idle client keeps its counter, refunds with a predictor,
  counters overwritten by a router) the counter is kept: forget returns False only where a later
  call may still drop it (c > B under those rules; B only grows). A predictor's own per-client
  state (vtc-avg's moving averages) is kept too: a returner is predicted from it.
The orders of the last KEPT_ORDERS forgotten clients are kept; an older one returns as a new
client, so it loses the tie with the client whose counter lifted it (one request's order). A
correction by `adjust` (a gateway reconciling with what the upstream reports) keeps this exact
when it raises a counter; a refund lowers one, and then a client forgotten before may return to
a floor below its old counter, at most the refunds since below.
"""

import heapq
import itertools
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from enum import Enum

from slora_vtc.cost import CostFunction, LinearCost
from slora_vtc.memory.admission import Budget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler, arrival_key, recomputed_tokens, requeue
from slora_vtc.sched.predict import LengthPredictor

KEPT_ORDERS = 100_000  # registration orders of forgotten clients kept for their return
EXACT_BELOW = 2.0**52  # integers up to here, and sums of two, are exact in a float


def _exact(counter: float, added: int) -> bool:
    return counter.is_integer() and abs(counter) + added < EXACT_BELOW


def _overtakes(other: tuple, best: tuple) -> int:
    """The first step s at which `other` (growing slower) comes before `best`: a smaller counter,
    or an equal one and an earlier registration. Both are (counter, order, rate per step, _)."""
    gap, closing = other[0] - best[0], best[2] - other[2]
    s = gap // closing
    return s if gap % closing == 0 and other[1] < best[1] else s + 1


class Lift(str, Enum):
    """What happens to a client's counter when its waiting queue goes from empty to non-empty."""

    PAPER = "paper"  # max(own, min over waiting others), or the last client to leave if none wait
    ARTIFACT = "artifact"  # as PAPER, but no lift when no other client waits
    NONE = "none"  # LCF: an idle client keeps its low counter


@dataclass
class _Client:
    order: int  # registration order: ties go to the earlier client, as in the artifact
    counter: float = 0.0
    weight: float = 1.0
    version: int = 0  # bumped when the counter drops, so older heap entries are ignored
    queue: deque | None = None


@dataclass
class _Admitted:
    """What a request's first admission fixed, kept until it finishes or is aborted."""

    input: float  # x_eff: uncached prompt tokens + charge_cached * cached ones
    predicted: float  # predicted output length (0 without prediction)
    charged: int  # highest token number charged for (token 1, the prefill's, is free)
    client: str = ""


class VTC(Scheduler):
    """Serve the waiting client with the smallest counter; charge service as it is delivered.

    Each request is charged h(x, max(n, p)) in total while it runs (p: predicted output length,
    0 without prediction) and refunded down to h(x, actual) at finish. With p = 0 this is exactly
    plain VTC: h(x, 0) at admission, then h(x, n) - h(x, n - 1) before the step making token n.
    Selection uses a heap of waiting clients keyed by counter, so it costs O(log clients).

    With a prefix cache, x is x_eff = uncached + charge_cached * cached prompt tokens, measured
    by the budget at admission (charge_cached = 1, the default, is the paper's VTC).

    Preemption: the victim is the latest arrival of the running client with the largest counter.
    It goes back to the head of its client's queue (that client re-enters the heap without a lift)
    and is not charged for its admission again; the token its second prefill yields is charged as
    the decode step it replaces would have been, so a preempted request costs what an unpreempted
    one does. With charge_recompute, its K/V computed again (Request.recomputed's count: the
    prefill minus the cached tokens minus its newest token, whose K/V was never computed) are
    charged h(recomputed, 0) on top.
    """

    def __init__(
        self,
        cost: CostFunction = LinearCost(),
        lift: Lift = Lift.PAPER,
        weights: dict[str, float] | None = None,
        predictor: LengthPredictor | None = None,
        extra_charge_at_finish: bool = False,
        charge_cached: float = 1.0,
        charge_recompute: bool = False,
    ):
        self.cost = cost
        self.lift = lift
        self.weights = dict(weights or {})
        self.predictor = predictor
        self.extra_charge_at_finish = extra_charge_at_finish
        self.charge_cached = charge_cached
        self.charge_recompute = charge_recompute
        self._clients: dict[str, _Client] = {}
        self._heap: list[tuple[float, int, int, str]] = []
        self._predicted: dict[int, _Admitted] = {}  # rid -> its charges, from first admission to its end
        self._last_left: str | None = None
        self._waiting = 0
        self._queued: dict[str, _Client] = {}  # clients with a waiting request (not every client ever seen)
        self._registered = 0  # clients registered so far (their orders)
        self._stamps = itertools.count(
            1
        )  # heap-entry versions, never reused (a forgotten client's stale entries stay stale)
        self._orders: OrderedDict[str, int] = (
            OrderedDict()
        )  # the latest KEPT_ORDERS forgotten clients -> their registration order
        self._kept: dict[str, float] = {}  # forgotten clients whose counter the lift would not give back -> it
        self._left_counter: float | None = None  # the last client to leave, once forgotten: its counter
        self._overwritten = False  # set_counter was used: counters may drop, so forgetting keeps them

    # -- counters -------------------------------------------------------------------------
    def counter(self, client: str) -> float:
        if client in self._clients:
            return self._clients[client].counter
        return self._kept.get(client, 0.0)

    def counters(self) -> dict[str, float]:
        return {name: c.counter for name, c in self._clients.items()}

    def counter_of(self, client: str) -> float | None:
        return self.counter(client)

    def weight_of(self, client: str) -> float:
        return self._clients[client].weight if client in self._clients else self.weights.get(client, 1.0)

    def min_waiting_client(self) -> str | None:
        """The waiting client with the smallest counter (None when nobody waits); O(log clients)."""
        return self._min_waiting()

    def set_counter(self, name: str, value: float) -> None:
        """Overwrite a client's counter (a router adopting the cluster-wide totals), keeping the heap valid."""
        self._overwritten = True
        client = self._client(name)
        client.counter = value
        if client.queue:
            client.version = next(self._stamps)
            self._push(name)

    def adjust(self, name: str, delta: float) -> None:
        """Add `delta` (in counter units: service / weight) to a client's counter: a correction once the
        service is known, or a refund (negative) of service that was not delivered."""
        client = self._client(name)
        client.counter += delta
        if delta < 0 and client.queue:
            client.version = next(self._stamps)
            self._push(name)

    def _client(self, name: str) -> _Client:
        if name not in self._clients:
            order = self._orders.pop(name, None)
            if order is None:
                order, self._registered = self._registered, self._registered + 1
            self._clients[name] = _Client(
                order, self._kept.pop(name, 0.0), weight=self.weights.get(name, 1.0), queue=deque()
            )
        return self._clients[name]

    def _charge(self, name: str, service: float) -> None:
        client = self._clients[name]
        client.counter += service / client.weight
        if service < 0 and client.queue:
            client.version = next(self._stamps)
            self._push(name)

    def _push(self, name: str) -> None:
        c = self._clients[name]
        heapq.heappush(self._heap, (c.counter, c.order, c.version, name))

    def _min_waiting(self) -> str | None:
        """The waiting client with the smallest counter (stale heap entries are refreshed lazily)."""
        while self._heap:
            counter, _, version, name = self._heap[0]
            c = self._clients.get(name)
            if c is None or version != c.version or not c.queue:
                heapq.heappop(self._heap)
            elif counter != c.counter:  # counters only grow between pushes: re-key and retry
                heapq.heapreplace(self._heap, (c.counter, c.order, c.version, name))
            else:
                return name
        return None

    # -- scheduler interface --------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> bool:
        client = self._client(req.client)
        if not client.queue:
            self._lift(client)
            client.version = next(self._stamps)
            client.queue.append(req)
            self._queued[req.client] = client
            self._push(req.client)
        else:
            client.queue.append(req)
        self._waiting += 1
        return True

    def _lift(self, client: _Client) -> None:
        if self.lift is Lift.NONE:
            return
        floor = self._floor()
        if floor is not None:
            client.counter = max(client.counter, floor)

    def _floor(self) -> float | None:
        """What an arriving client with an empty queue is lifted to (None: no lift)."""
        if self.lift is Lift.NONE:
            return None
        other = self._min_waiting()
        if other is not None:
            return self._clients[other].counter
        if self.lift is not Lift.PAPER:
            return None
        if self._last_left is None:
            return self._left_counter
        return self._clients[self._last_left].counter

    def select(self, budget: Budget, now: float) -> list[Request]:
        admitted = []
        while (name := self._min_waiting()) is not None:
            client = self._clients[name]
            req = client.queue[0]
            if not budget.try_add(req):
                break
            client.queue.popleft()
            self._waiting -= 1
            if not client.queue:
                self._last_left, self._left_counter = name, None
                del self._queued[name]
            if req.generated:  # only a preempted request comes back with tokens
                self._charge_readmission(req, budget)
            else:
                self._charge_admission(req, budget)
            admitted.append(req)
        return admitted

    def _charge_admission(self, req: Request, budget: Budget) -> None:
        cached = budget.cached_len(req) if self.charge_cached != 1 else 0  # x_eff = x when cached tokens weigh 1
        x_eff = req.prompt_len - (1 - self.charge_cached) * cached
        predicted = self.predictor.predict(req) if self.predictor else 0.0
        self._predicted[req.rid] = _Admitted(x_eff, predicted, charged=req.generated + 1, client=req.client)
        self._charge(req.client, self.cost(x_eff, predicted))

    def _charge_readmission(self, req: Request, budget: Budget) -> None:
        """A preempted request prefilled again: its next token, unless the decode step it was
        preempted from had charged it already; and the recomputation if asked."""
        if self._predicted[req.rid].charged <= req.generated:
            self._charge(req.client, self._token_charge(req))
        if self.charge_recompute:
            self._charge(req.client, self.cost(recomputed_tokens(req, budget.cached_len(req)), 0))

    def on_decode_step(self, running: list[Request], now: float) -> None:
        for req in running:
            self._charge(req.client, self._token_charge(req))

    def on_decode_steps(self, running: list[Request], steps: int, now: float) -> bool:
        rates = self._steady_rates(running, steps)
        if rates is None:
            return False
        for name, rate in rates.items():
            self._clients[name].counter += rate * steps
        for req in running:
            self._predicted[req.rid].charged = req.generated + steps
        return True

    def _steady_rates(self, running: list[Request], steps: int) -> dict[str, int] | None:
        """Per client, what each of the next `steps` decode steps of `running` charges it, where
        that is the same every step and whole numbers, so that one product equals the per-step
        sums exactly (float sums of integers below 2**53 do not round); None otherwise."""
        cost = self.cost
        if type(self).on_decode_step is not VTC.on_decode_step or type(cost) is not LinearCost:
            return None
        if not (float(cost.w_p).is_integer() and float(cost.w_q).is_integer() and cost.w_q >= 0):
            return None
        if (
            self.predictor is None and not self.weights and self.charge_cached in (0, 1)
        ):  # every token w_q, whole inputs
            rates = {name: n * int(cost.w_q) for name, n in Counter(req.client for req in running).items()}
        else:
            rates = {}
            for req in running:
                record, client = self._predicted[req.rid], self._clients[req.client]
                if record.predicted >= req.generated + steps:  # every one of these tokens was charged up front
                    charge = 0
                elif record.predicted <= req.generated and float(record.input).is_integer() and client.weight == 1.0:
                    charge = int(cost.w_q)  # h(x, n) - h(x, n - 1), exactly
                else:
                    return None
                rates[req.client] = rates.get(req.client, 0) + charge
        return rates if all(_exact(self._clients[name].counter, rate * steps) for name, rate in rates.items()) else None

    def heads_while_decoding(
        self, running: list[Request], steps: int, budget: Budget
    ) -> list[tuple[int, Request]] | None:
        """The waiting client with the smallest counter after s steps, its counter growing by its
        running requests' charges: the first client stays first until one that grows slower
        overtakes it (integer counters, so the crossing steps are exact)."""
        rates = self._steady_rates(running, steps) if type(self).select is VTC.select else None
        if rates is None:
            return None
        waiting = [(int(c.counter), c.order, rates.get(name, 0), c) for name, c in self._queued.items()]
        if not waiting or any(not _exact(c.counter, rate * steps) for _, _, rate, c in waiting):
            return None
        heads, s = [], 0
        while s < steps:
            best = min(waiting, key=lambda w: (w[0] + w[2] * s, w[1]))
            heads.append((s, best[3].queue[0]))
            s = min([_overtakes(w, best) for w in waiting if w[2] < best[2]], default=steps)
        return heads

    def _token_charge(self, req: Request) -> float:
        record, n = self._predicted[req.rid], req.generated + 1
        record.charged = n
        x, p = record.input, record.predicted
        if n <= p:
            return 0.0
        return self.cost(x, n) - self.cost(x, max(n - 1, p))

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> None:
        if self.extra_charge_at_finish:
            self.on_decode_step(batch, now)
        for req in finished:
            self._settle(req)
            if self.predictor:
                self.predictor.observe(req)

    def on_abort(self, req: Request, now: float) -> None:
        self._settle(req)

    def _settle(self, req: Request) -> None:
        """Refund a prediction that overshot what the request actually received; forget it."""
        record = self._predicted.pop(req.rid)
        x, predicted = record.input, record.predicted
        if predicted > req.generated:
            self._charge(req.client, self.cost(x, req.generated) - self.cost(x, predicted))

    # -- preemption -----------------------------------------------------------------------
    def on_preempt(self, req: Request, now: float) -> None:
        client = self._client(req.client)
        if not client.queue:  # back into the heap, without a lift: it was being served
            client.version = next(self._stamps)
            requeue(client.queue, req)
            self._queued[req.client] = client
            self._push(req.client)
        else:
            requeue(client.queue, req)
        self._waiting += 1

    def choose_victim(self, running: list[Request], now: float) -> Request:
        return max(running, key=lambda r: (self.counter(r.client), arrival_key(r)))

    def num_waiting(self) -> int:
        return self._waiting

    def waiting_by_client(self) -> dict[str, int]:
        return {name: len(c.queue) for name, c in self._queued.items()}

    def drain(self) -> list[Request]:
        drained = [req for c in self._queued.values() for req in c.queue]
        for c in self._queued.values():
            c.queue.clear()
        self._queued.clear()
        self._heap.clear()
        self._waiting = 0
        for req in drained:
            self._forget_preempted(req)
        return drained

    def remove(self, req: Request) -> bool:
        client = self._clients.get(req.client)
        if client is None or req not in client.queue:
            return False
        client.queue.remove(req)
        self._waiting -= 1
        if not client.queue:
            del self._queued[req.client]
        self._forget_preempted(req)
        return True

    def _forget_preempted(self, req: Request) -> None:
        """A preempted request that ends while waiting is settled like an aborted running one."""
        if req.generated:
            self._settle(req)

    # -- forgetting idle clients (module docstring: what is kept, and why that is exact) ----------
    def forget(self, client: str, now: float) -> bool:
        running = {admitted.client for admitted in self._predicted.values()}
        record = self._clients.get(client)
        if record is not None:
            if record.queue or client in running:
                return False  # not idle: the caller asked too early
            del self._clients[client]
            self._orders[client] = record.order
            if len(self._orders) > KEPT_ORDERS:
                self._orders.popitem(last=False)
            if self._last_left == client:
                self._last_left, self._left_counter = None, record.counter
            counter = record.counter
        elif client in self._kept:  # asked again: the bound may have risen
            counter = self._kept.pop(client)
        else:
            return True
        recoverable = self.lift is Lift.PAPER and self.predictor is None and not self._overwritten
        if counter == 0 or (recoverable and (bound := self._lowest_floor(running)) is not None and counter <= bound):
            return True
        self._kept[client] = counter
        return not recoverable

    def _lowest_floor(self, running: set[str]) -> float | None:
        """B of the module docstring: no later floor is below it (None: there may be no floor,
        which is so until a client first leaves the queue: waiting clients may all be removed)."""
        floor = self._floor()
        if floor is None or (self._last_left is None and self._left_counter is None):
            return None
        left = self._left_counter if self._last_left is None else self._clients[self._last_left].counter
        return min([floor, *(self._clients[name].counter for name in running), *(() if left is None else (left,))])
