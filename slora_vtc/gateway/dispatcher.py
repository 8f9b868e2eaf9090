"""Per-client queues (a scheduler of the registry) in front of the upstreams' in-flight slots.

The dispatcher plays the engine's part for the scheduler: every request arrives (`on_arrival`),
is admitted by `select` under a budget of one free slot, is charged token by token as its stream
arrives (`on_decode_step`), and ends with `on_finish` or `on_abort`. Everything here runs on the
event loop, between awaits, so no lock is needed; `now` is the loop's monotonic time since start.
"""

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from slora_vtc.cost import CostFunction
from slora_vtc.gateway.charges import Corrections, engine_charge
from slora_vtc.gateway.upstream import Upstream, UpstreamPool
from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request, State
from slora_vtc.sched import Scheduler
from slora_vtc.sched.ledger import forgets
from slora_vtc.sched.shedding import queue_refuses
from slora_vtc.serving.errors import ApiError
from slora_vtc.serving.ledger import MAX_LABELS, ClientLedger, Tally

RETRY_AFTER_S = 1


class Busy(ApiError):
    """Refused for now (429 / 503): the answer carries Retry-After."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(status, message, kind, code, headers={"Retry-After": str(RETRY_AFTER_S)})


@dataclass(eq=False)
class Ticket:
    """One request through the gateway: its scheduler record and what it was charged."""

    request: Request
    slot: asyncio.Future  # resolves to the Upstream it may use (or raises: no upstream is left)
    upstream: Upstream | None = None
    charged: float = 0.0  # counter units the scheduler charged it (refunded if it fails)
    service: float = 0.0  # service units it added to its client's ledger
    predicts: bool = False  # its output is seen only at its end: its max_tokens is charged at dispatch
    predicted: float = 0.0  # counter units of that prediction, until its usage replaces it


@dataclass
class ClientStats(Tally):
    """A client's record in the gateway's ledger (serving/ledger.py): its service (failed requests
    are refunded theirs), requests by outcome, and its requests in flight on some upstream."""

    LEVELS: ClassVar[tuple[str, ...]] = ("live", "inflight")

    inflight: int = 0


class SlotBudget(AdmissionBudget):
    """The gateway's admission budget: room for one request per free in-flight slot on the upstreams
    (each admitted request takes one at once). Requests carry no token ids, so nothing is cached."""

    def __init__(self, pool: UpstreamPool):
        self.pool = pool

    def try_add(self, req: Request) -> bool:
        return self.pool.best() is not None


class Dispatcher:
    """The gateway's queues and its ledger: requests arrive (`submit`), get a slot (`pump`), are
    charged as their tokens come (`on_tokens`, `reconcile`) and end exactly once (`finish`,
    `fail`, `abort`)."""

    def __init__(
        self,
        scheduler: Scheduler,
        pool: UpstreamPool,
        cost: CostFunction,
        max_waiting: int,
        clock: Callable[[], float] = time.monotonic,
        max_labels: int = MAX_LABELS,
    ):
        self.scheduler, self.pool, self.cost, self.max_waiting = scheduler, pool, cost, max_waiting
        self.corrections = Corrections(scheduler)
        self._clock, self._start = clock, clock()
        self.stats: ClientLedger[ClientStats] = ClientLedger(ClientStats, max_labels, self.now)
        self._waiting: dict[int, Ticket] = {}
        self._rids = itertools.count()

    def now(self) -> float:
        return self._clock() - self._start

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # -- arrival and dispatch ----------------------------------------------------------------
    def submit(self, client: str, prompt_len: int, max_tokens: int, predicts: bool = False) -> Ticket:
        """Queue a request (or refuse it: 503 when nothing can serve it or the queue is full, 429
        over the client's rate limit); it may be dispatched at once. `predicts`: a request whose
        tokens cannot be seen as they come (passed through whole), charged its max_tokens at dispatch."""
        if not self.pool.any_up:
            self.stats.refuse(client)
            raise Busy(503, "no upstream is available", "server_error", "upstream_unavailable")
        if queue_refuses(self.scheduler, client, self.max_waiting):
            self.stats.refuse(client)
            raise Busy(
                503,
                f"the gateway's queue is full ({self.max_waiting} requests waiting; past that bound a client "
                "holding its even share of it is refused)",
                "server_error",
                "queue_full",
            )
        now = self.now()
        req = Request(client, prompt_len, max_tokens, now, rid=next(self._rids))
        if not self.scheduler.on_arrival(req, now):
            self.stats.refuse(client)
            raise Busy(429, f"client '{client}' is over its rate limit", "rate_limit_error", "rate_limit_exceeded")
        ticket = Ticket(req, asyncio.get_running_loop().create_future(), predicts=predicts)
        self._waiting[req.rid] = ticket
        self.stats.begin(client)
        self.pump()
        return ticket

    def expire(self, idle_s: float) -> None:
        """Forget the clients idle for `idle_s` or longer: their numbers stay in the ledger's total,
        and the scheduler drops what it can (Scheduler.forget; asked again later where it says so)."""
        self.stats.expire(idle_s, forgets(self.scheduler))

    def pump(self) -> None:
        """Dispatch waiting requests, in the scheduler's order, while some upstream has a free slot."""
        sched, budget, now = self.scheduler, SlotBudget(self.pool), self.now()
        while self._waiting and (req := sched.peek(budget)) is not None and budget.try_add(req):
            sched.pop(req, now)
            charged = sched.on_prefill(req, req.prompt_len, 0, now)
            self._dispatch(self._waiting.pop(req.rid), self.pool.best(), charged)

    def _dispatch(self, ticket: Ticket, upstream: Upstream, charged: float) -> None:
        req = ticket.request
        req.state = State.RUNNING
        ticket.charged += charged
        ticket.upstream = upstream
        self.pool.acquire(upstream)
        self.stats[req.client].inflight += 1
        self._serve(ticket, self.cost(req.prompt_len, 0))
        if ticket.predicts:
            self._predict(ticket)
        ticket.slot.set_result(upstream)

    def _predict(self, ticket: Ticket) -> None:
        """Charge the request as if it produced all of max_tokens (beyond what `select` charged
        already: a predicting VTC's own prediction); `reconcile` takes it back for the true count."""
        req = ticket.request
        if not self.corrections.kept:
            return
        extra = (
            engine_charge(self.cost, req.prompt_len, req.max_new_tokens) / self.corrections.weight(req.client)
            - ticket.charged
        )
        if extra > 0:
            self.corrections.adjust(req.client, extra)
            ticket.charged += extra
            ticket.predicted = extra

    def move(self, ticket: Ticket) -> bool:
        """Move a dispatched request that its upstream could not take (nothing was sent) to the
        upstream with the most free slots; False if none has one. Its charges stay: it is still
        being served."""
        other = self.pool.best()
        if other is None:
            return False
        self.pool.release(ticket.upstream)
        self.pool.acquire(other)
        ticket.upstream = other
        return True

    def fail_waiting(self, error: ApiError) -> None:
        """Nothing can serve the waiting requests (every upstream is down): end them with `error`."""
        for req in self.scheduler.drain():
            ticket = self._waiting.pop(req.rid)
            req.state = State.ABORTED
            self.stats.end(req.client, "failed")
            ticket.slot.set_exception(error)

    # -- charges -------------------------------------------------------------------------------
    def on_tokens(self, ticket: Ticket, count: int = 1) -> None:
        """`count` more tokens arrived from the upstream: charge them now."""
        req, now = ticket.request, self.now()
        for _ in range(count):
            if req.generated:  # the first token comes with the prefill, free (as in the engine)
                ticket.charged += self.scheduler.on_decode_step([req], now)
            req.append_token(None, now)
            self._serve(ticket, self.cost(req.prompt_len, req.generated) - self.cost(req.prompt_len, req.generated - 1))

    def reconcile(self, ticket: Ticket, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The upstream's `usage`: charge tokens the chunks did not show, and correct the prompt's
        estimate (counter and ledger) to its true length. A prediction made at dispatch is taken back first."""
        req = ticket.request
        if ticket.predicted:
            self.corrections.adjust(req.client, -ticket.predicted)
            ticket.charged -= ticket.predicted
            ticket.predicted = 0.0
        if completion_tokens is not None and completion_tokens > req.generated:
            self.on_tokens(ticket, completion_tokens - req.generated)
        if prompt_tokens is not None and prompt_tokens != req.prompt_len:
            delta = engine_charge(self.cost, prompt_tokens, req.generated) - engine_charge(
                self.cost, req.prompt_len, req.generated
            )
            delta /= self.corrections.weight(req.client)
            self.corrections.adjust(req.client, delta)
            ticket.charged += delta
            req.prompt_len = prompt_tokens
        self._serve(ticket, self.cost(req.prompt_len, req.generated) - ticket.service)

    def _serve(self, ticket: Ticket, service: float) -> None:
        ticket.service += service
        self.stats.serve(ticket.request.client, service, self.now())

    # -- endings -------------------------------------------------------------------------------
    def finish(self, ticket: Ticket) -> None:
        if ticket.request.ended:
            return
        req = ticket.request
        ticket.charged += self.scheduler.on_finish([req], [req], self.now())
        ticket.upstream.finished += 1
        self._end(ticket, State.FINISHED, "finished")

    def fail(self, ticket: Ticket, outcome: str = "failed") -> None:
        """The upstream failed it (or refused it: outcome "rejected"): it ends with an error and is
        refunded everything it was charged."""
        req = ticket.request
        if req.ended:
            return
        if ticket.upstream is None:
            self._withdraw(ticket, outcome)
            return
        ticket.charged += self.scheduler.on_abort(req, self.now())
        self.corrections.adjust(req.client, -ticket.charged)
        ticket.charged = 0.0
        self._serve(ticket, -ticket.service)
        self._end(ticket, State.ABORTED, outcome)

    def abort(self, ticket: Ticket) -> None:
        """The client went away: it keeps the charges for what it was sent."""
        req = ticket.request
        if req.ended:
            return
        if ticket.upstream is None:
            self._withdraw(ticket, "aborted")
            return
        ticket.charged += self.scheduler.on_abort(req, self.now())
        self._end(ticket, State.ABORTED, "aborted")

    def _withdraw(self, ticket: Ticket, outcome: str) -> None:
        """A request that was never dispatched leaves the queue."""
        req = ticket.request
        if self._waiting.pop(req.rid, None) is not None:
            self.scheduler.remove(req)
            req.state = State.ABORTED
            self.stats.end(req.client, outcome)

    def _end(self, ticket: Ticket, state: State, outcome: str) -> None:
        req = ticket.request
        req.state = state
        self.stats[req.client].inflight -= 1
        self.stats.end(req.client, outcome)
        self.pool.release(ticket.upstream)
        self.pump()
