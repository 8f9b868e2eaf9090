"""The scheduler core: what every driver uses. Schedulers see requests, token counts and `now`; never
tensors, never a clock.

A driver (the engine, the gateway, a cluster's pull router, a peek/pop queue such as vLLM's waiting
queue) hands requests in (`on_arrival`), asks which to admit (`peek` then `pop`, or `select`, which
is that loop under an admission budget), takes one back out (`remove`, `drain`), and reports the
service as it is delivered (`on_prefill`, `on_decode_step`, `on_finish`, `on_abort`, `on_preempt`).
Each service event returns what it charged (counter units; negative: a refund), so that no driver
reads counters before and after a call. docs/design.md ("Schedulers", its table of drivers) lists
which calls each driver makes.

What a scheduler needs from its driver and offers beyond the core, it declares in `traits`:
the counters of `sched/ledger.py` (`Ledger`), the macro-step look-ahead of `sched/lookahead.py`
(`LookAhead`), preemption, token ids. Drivers read the traits, never the class.
"""

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from operator import attrgetter

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request


@dataclass(frozen=True)
class Traits:
    """What a scheduler needs and offers."""

    needs_token_ids: bool = False  # orders by what the prefix cache holds: a driver without ids cannot use it
    ledger: bool = False  # keeps per-client counters: the Ledger methods answer (counter_of, adjust, forget, ...)
    weights: bool = False  # takes per-client share weights (Ledger.set_weight)
    preemption: bool = False  # takes preempted requests back (on_preempt) and picks victims that make sense
    shareable: bool = False  # least counter first: several router instances can share and sync its counters
    lookahead: bool = False  # tells macro-steps what its next decode steps charge and select tries (LookAhead)
    defers: bool = False  # leaves the order to a scheduler downstream: a driver before one sends requests at once
    shared_queue: bool = False  # other engines pull from its queue (a cluster replica's view of a shared scheduler)


class Scheduler(ABC):
    """Decides which waiting requests run next, and in which order; charges service as it is delivered."""

    traits = Traits()

    # -- the queue ----------------------------------------------------------------------------
    @abstractmethod
    def on_arrival(self, req: Request, now: float) -> bool:
        """Queue the request; return False to reject it (it is then never served)."""

    @abstractmethod
    def peek(self, budget: AdmissionBudget) -> Request | None:
        """The waiting request this scheduler would admit next (None: none). It stays waiting;
        asked again with nothing changed in between, the answer is the same request."""

    @abstractmethod
    def pop(self, req: Request, now: float) -> None:
        """Take `req`, the request `peek` just returned, out of the queue: it runs now."""

    @abstractmethod
    def remove(self, req: Request) -> bool:
        """Take a waiting request out for good (an abort, a client gone); whether it was waiting."""

    @abstractmethod
    def drain(self) -> list[Request]:
        """Take out and return every waiting request (shutdown)."""

    @abstractmethod
    def num_waiting(self) -> int:
        """Requests queued and not yet admitted."""

    def waiting_by_client(self) -> dict[str, int]:
        """Waiting requests per client (monitoring, fair shedding); clients with none may be left out."""
        return {}

    def select(self, budget: AdmissionBudget, now: float) -> list[Request]:
        """Admit in this scheduler's order until the budget refuses one (head-of-line: never a
        request past it), charging each admitted request's prefill."""
        admitted = []
        while (req := self.peek(budget)) is not None and budget.try_add(req):
            self.pop(req, now)
            cached = budget.cached_len(req)
            self.on_prefill(req, req.prefill_len - cached, cached, now)
            admitted.append(req)
        return admitted

    # -- service, as it is delivered: each returns what it charged -------------------------------
    def on_prefill(self, req: Request, computed: int, cached: int, now: float) -> float:
        """`req`'s prefill computes `computed` tokens and reuses `cached` from the prefix cache."""
        return 0.0

    def on_decode_step(self, running: list[Request], now: float) -> float:
        """Before a decode step: each of `running` is about to get one more token."""
        return 0.0

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> float:
        """After a step in which `finished` completed; `batch` still includes them."""
        return 0.0

    def on_abort(self, req: Request, now: float) -> float:
        """A running request ended early (aborted, or failed): forget what was kept for it."""
        return 0.0

    def on_preempt(self, req: Request, now: float) -> None:
        """A running request lost its K/V: queue it again, ahead of what arrived after it. It keeps
        its generated tokens and is prefilled again later (only with `traits.preemption`)."""
        raise NotImplementedError(f"{type(self).__name__} does not take preempted requests back")

    def choose_victim(self, running: list[Request], now: float) -> Request:
        """The running request to preempt when memory runs short. The default, vLLM's: the latest arrival."""
        return max(running, key=arrival_key)

    def victim_order(self, running: list[Request], now: float) -> list[Request]:
        """`running` in the order `choose_victim` would take them: its victim, then the victim among
        the rest, and so on (sched/victims.py). One sort where choose_victim is a largest key."""
        if type(self).choose_victim is Scheduler.choose_victim:
            return sorted(running, key=ARRIVAL_KEY, reverse=True)
        return victims_one_by_one(self, running, now)

    def victim_order_after(self, running: list[Request], steps: int, now: float) -> list[Request] | None:
        """victim_order as it will be once `steps` decode steps of `running` are charged (macro-steps
        of chunked batching); None where the scheduler cannot tell without charging them."""
        return self.victim_order(running, now) if type(self).choose_victim is Scheduler.choose_victim else None


def victims_one_by_one(scheduler: Scheduler, running: list[Request], now: float) -> list[Request]:
    """Scheduler.victim_order by asking `choose_victim` again and again (O(running^2))."""
    remaining, order = list(running), []
    while remaining:
        victim = scheduler.choose_victim(remaining, now)
        remaining.remove(victim)
        order.append(victim)
    return order


def arrival_key(req: Request) -> tuple[float, int]:
    """The order requests arrived in (rid breaks ties, as the engine numbers them in order)."""
    return (req.arrival, req.rid)


ARRIVAL_KEY = attrgetter("arrival", "rid")  # arrival_key, for sorting many


def requeue(queue: deque[Request], req: Request) -> None:
    """Put a preempted request back into an arrival-ordered queue: ahead of every request that
    arrived after it, behind those that arrived before it."""
    key = arrival_key(req)
    pos = next((i for i, other in enumerate(queue) if arrival_key(other) > key), len(queue))
    queue.insert(pos, req)


def recomputed_tokens(req: Request, cached: int) -> int:
    """Tokens whose K/V a preempted request's next prefill computes again (as Request.recomputed
    counts them): all but the cached ones and its newest token, whose K/V was never computed."""
    return max(0, req.prefill_len - 1 - cached)
