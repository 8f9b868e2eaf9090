"""The Virtual Token Counter (paper section 4, Algorithm 2), its lift rules and weights (LCF, weighted VTC).

Every client has a counter of the service it received. The waiting client with the smallest counter
goes next (ties: the client registered first), and its oldest request is admitted if it fits; if it
does not, nothing else is admitted this round. Service is charged as it is delivered, with a cost
function h(x, y) of x prompt and y output tokens: h(x, 0) when the prompt is admitted, then
h(x, n) - h(x, n - 1) before the decode step that makes token n (the prefill makes token 1, free),
so that a request that ends with y tokens was charged h(x, y) in all. A weighted client's charges
are divided by its weight, so backlogged clients receive service in proportion to their weights.

The lift: when a client's queue goes from empty to non-empty, its counter becomes at least the
smallest counter among the other waiting clients, so that credit saved while idle cannot be spent
later. When no other client waits, the paper lifts to the counter of the client that left the queue
last (`Lift.PAPER`), the artifact's code does not lift (`Lift.ARTIFACT`), and LCF never lifts.
`Lift.RUNNING`, beyond the paper, is for clients whose requests spend part of their life outside the
scheduler (a closed-loop client's round trip between one answer and its next request): such a client
is lifted on every return while its other requests still run, losing the deficit VTC was about to
make good. Under RUNNING a client with a request running is lifted only to the floor minus the worst
case of the arriving request, h(x, max_new_tokens) / weight: it keeps at most what a continuously
backlogged client may lag by (the paper's bound for backlogged clients is of one request's size), and
cannot bank more. A client with nothing running is lifted as the paper does.

Beyond the paper, each in its own module: length prediction and refunds (vtc_predict.py),
preemption (vtc_preempt.py), the exact look-ahead that macro-steps use (vtc_lookahead.py), and
forgetting idle clients (vtc_forget.py). With a prefix cache, x is x_eff = uncached +
charge_cached * cached prompt tokens (charge_cached = 1, the default, is the paper's).
"""

from collections import deque
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

from slora_vtc.cost import CostFunction, LinearCost
from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched import vtc_lookahead
from slora_vtc.sched.base import Scheduler, Traits
from slora_vtc.sched.least_counter import Client, LeastCounter
from slora_vtc.sched.ledger import Ledger
from slora_vtc.sched.lookahead import LookAhead
from slora_vtc.sched.vtc_forget import IdleClients
from slora_vtc.sched.vtc_preempt import Preemption


class Lift(str, Enum):
    """What happens to a client's counter when its waiting queue goes from empty to non-empty."""

    PAPER = "paper"  # max(own, min over waiting others), or the last client to leave if none wait
    ARTIFACT = "artifact"  # as PAPER, but no lift when no other client waits
    NONE = "none"  # LCF: an idle client keeps its low counter
    RUNNING = "running"  # as PAPER, but a client with a request running keeps up to one request's credit


@dataclass
class Record:
    """What a request's first admission fixed, kept until it finishes or is aborted."""

    client: str
    input: float  # x_eff: uncached prompt tokens + charge_cached * cached ones
    charged: int  # highest token number charged for (token 1, the prefill's, is free)
    predicted: float = 0.0  # predicted output length, charged up front (vtc_predict.py; 0 here)


class VTC(Preemption, Scheduler, Ledger, LookAhead):
    """Serve the waiting client with the smallest counter; charge service as it is delivered
    (module docstring). Selection uses a heap of waiting clients keyed by counter: O(log clients)."""

    traits = Traits(ledger=True, weights=True, preemption=True, shareable=True, lookahead=True)
    refunds = False  # whether a counter can fall by a refund (length prediction)

    def __init__(
        self,
        cost: CostFunction = LinearCost(),
        lift: Lift = Lift.PAPER,
        weights: dict[str, float] | None = None,
        extra_charge_at_finish: bool = False,
        charge_cached: float = 1.0,
        charge_recompute: bool = False,
    ):
        self.cost, self.lift, self.weights = cost, lift, dict(weights or {})
        self.extra_charge_at_finish = extra_charge_at_finish
        self.charge_cached, self.charge_recompute = charge_cached, charge_recompute
        self.clients: dict[str, Client] = {}  # every client not forgotten
        self.queued: dict[str, Client] = {}  # those with a waiting request
        self.records: dict[int, Record] = {}  # rid -> its charges, from first admission to its end
        self.last_left: str | None = None  # the last client whose queue emptied by admission
        self.idle = IdleClients()  # what forgotten clients leave behind (vtc_forget.py)
        self.by_counter = LeastCounter()  # the clients in `queued`, least counter first
        self._waiting = 0
        self._registered = 0  # clients registered so far (their orders)
        self.steady_memo: tuple[tuple[Request, ...], dict[str, int]] | None = None  # vtc_lookahead: a batch's rates

    # -- the ledger -----------------------------------------------------------------------------
    def counter_of(self, client: str) -> float:
        c = self.clients.get(client)
        return c.counter if c is not None else self.idle.kept.get(client, 0.0)

    def counters(self) -> dict[str, float]:
        return {name: c.counter for name, c in self.clients.items()}

    def weight_of(self, client: str) -> float:
        c = self.clients.get(client)
        return c.weight if c is not None else self.weights.get(client, 1.0)

    def set_weight(self, client: str, weight: float) -> None:
        self.weights[client] = weight
        if client in self.clients:
            self.clients[client].weight = weight

    def adjust(self, client: str, delta: float) -> None:
        self._add(self._client(client), client, delta)

    def set_counter(self, client: str, value: float) -> None:
        self.idle.overwritten = True
        c = self._client(client)
        c.counter = value
        if c.queue:
            self.by_counter.push(client, c)

    def forget(self, client: str, now: float) -> bool:
        recoverable = self.lift is Lift.PAPER and not self.refunds and not self.idle.overwritten
        return self.idle.forget(self, client, recoverable)

    def _client(self, name: str) -> Client:
        c = self.clients.get(name)
        if c is None:
            order = self.idle.returning_order(name)
            if order is None:
                order, self._registered = self._registered, self._registered + 1
            c = Client(order, self.idle.returning_counter(name), self.weights.get(name, 1.0), queue=deque())
            self.clients[name] = c
            if name == self.idle.left_name:  # the last to leave the queue is back: the floor follows it again
                self.last_left = name
                self.idle.left_again()
        return c

    def _charge(self, name: str, service: float) -> float:
        """Charge a client `service` (divided by its weight); what its counter gained."""
        c = self.clients[name]
        return self._add(c, name, service / c.weight)

    def _add(self, c: Client, name: str, delta: float) -> float:
        c.counter += delta
        if delta < 0 and c.queue:  # a counter that fell must move up the heap
            self.by_counter.push(name, c)
        return delta

    # -- the queue: lift, least counter first ------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> bool:
        c = self._client(req.client)
        if not c.queue:
            if (floor := self.floor()) is not None:
                if self.lift is Lift.RUNNING and self._serving(req.client):
                    floor -= self.cost(req.prompt_len, req.max_new_tokens) / c.weight
                c.counter = max(c.counter, floor)
            c.queue.append(req)
            self.queued[req.client] = c
            self.by_counter.push(req.client, c)
        else:
            c.queue.append(req)
        self._waiting += 1
        return True

    def floor(self) -> float | None:
        """What an arriving client with an empty queue is lifted to (None: no lift)."""
        if self.lift is Lift.NONE:
            return None
        other = self.least_waiting()
        if other is not None:
            return self.clients[other].counter
        if self.lift is Lift.ARTIFACT:
            return None
        return self.idle.left_counter if self.last_left is None else self.clients[self.last_left].counter

    def _serving(self, client: str) -> bool:
        """Whether a request of the client is running (admitted, not yet ended)."""
        return any(record.client == client for record in self.records.values())

    def least_waiting(self) -> str | None:
        """The waiting client with the smallest counter."""
        return self.by_counter.least(self.clients)

    def peek(self, budget: AdmissionBudget) -> Request | None:
        name = self.least_waiting()
        return None if name is None else self.clients[name].queue[0]

    def pop(self, req: Request, now: float) -> None:
        c = self.clients[req.client]
        c.queue.popleft()
        self._waiting -= 1
        if not c.queue:
            self.last_left = req.client
            self.idle.left_again()
            del self.queued[req.client]

    def remove(self, req: Request) -> bool:
        c = self.clients.get(req.client)
        if c is None or req not in c.queue:
            return False
        c.queue.remove(req)
        self._waiting -= 1
        if not c.queue:
            del self.queued[req.client]
        self._end_waiting(req)
        return True

    def drain(self) -> list[Request]:
        drained = [req for c in self.queued.values() for req in c.queue]
        for c in self.queued.values():
            c.queue.clear()
        self.queued.clear()
        self.by_counter.clear()
        self._waiting = 0
        for req in drained:
            self._end_waiting(req)
        return drained

    def _end_waiting(self, req: Request) -> None:
        """A preempted request that ends while waiting is settled like an aborted running one (one
        preempted in mid-prompt, before its first token, has a record too)."""
        if req.rid in self.records:
            self.settle(req)

    def num_waiting(self) -> int:
        return self._waiting

    def waiting_by_client(self) -> dict[str, int]:
        return {name: len(c.queue) for name, c in self.queued.items()}

    # -- charging ------------------------------------------------------------------------------------
    def on_prefill(self, req: Request, computed: int, cached: int, now: float) -> float:
        if req.generated:  # only a preempted request comes back with tokens (vtc_preempt.py)
            return self.readmission_charge(req, cached)
        x_eff = (computed + cached) - (1 - self.charge_cached) * (cached if self.charge_cached != 1 else 0)
        record = self.records[req.rid] = Record(req.client, x_eff, charged=req.generated + 1)
        return self._charge(req.client, self.admission_charge(req, record))

    def admission_charge(self, req: Request, record: Record) -> float:
        """What admitting the prompt costs: h(x, 0)."""
        return self.cost(record.input, 0.0)

    def on_decode_step(self, running: list[Request], now: float) -> float:
        return sum(self._charge(req.client, self.token_charge(req)) for req in running)

    def token_charge(self, req: Request) -> float:
        """What the token about to be produced costs: h(x, n) - h(x, n - 1)."""
        record, n = self.records[req.rid], req.generated + 1
        record.charged = n
        return self.cost(record.input, n) - self.cost(record.input, n - 1)

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> float:
        charged = self.on_decode_step(batch, now) if self.extra_charge_at_finish else 0.0
        return charged + sum(self.settle(req) for req in finished)

    def on_abort(self, req: Request, now: float) -> float:
        return self.settle(req)

    def settle(self, req: Request) -> float:
        """A request ends: forget its record (vtc_predict.py refunds a prediction here)."""
        del self.records[req.rid]
        return 0.0

    # -- the look-ahead of macro-steps (vtc_lookahead.py) ---------------------------------------------
    KNOWN_TO_LOOKAHEAD = {
        "peek": peek, "on_arrival": on_arrival, "on_decode_step": on_decode_step, "token_charge": token_charge
    }  # fmt: skip

    @cached_property
    def decode_token_charge(self) -> int | None:
        """What every decode token costs where that is whole and alike for every request, else None
        (vtc_lookahead.whole_token_charge: its class's rules and its cost, fixed once built)."""
        return vtc_lookahead.whole_token_charge(self)

    def charge_steps(self, running: list[Request], steps: int, now: float) -> bool:
        return vtc_lookahead.charge_steps(self, running, steps)

    def heads(self, running: list[Request], steps: int, budget: AdmissionBudget) -> list[tuple[int, Request]] | None:
        return vtc_lookahead.heads(self, running, steps)

    def queues_behind(self, req: Request) -> bool:
        return vtc_lookahead.queues_behind(self, req)
