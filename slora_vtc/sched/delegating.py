"""One base for wrappers: every call of the core and of each capability goes to the wrapped scheduler,
so that a wrapper (a rate limit, a cluster replica's view of a shared scheduler) overrides only what
it changes and never drops a method. Its traits are the wrapped scheduler's."""

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler, Traits
from slora_vtc.sched.ledger import Ledger
from slora_vtc.sched.lookahead import LookAhead


class Delegating(Scheduler, Ledger, LookAhead):
    def __init__(self, inner: Scheduler):
        self.inner = inner

    @property
    def traits(self) -> Traits:
        return self.inner.traits

    # -- the core ---------------------------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> bool:
        return self.inner.on_arrival(req, now)

    def peek(self, budget: AdmissionBudget) -> Request | None:
        return self.inner.peek(budget)

    def pop(self, req: Request, now: float) -> None:
        self.inner.pop(req, now)

    def remove(self, req: Request) -> bool:
        return self.inner.remove(req)

    def drain(self) -> list[Request]:
        return self.inner.drain()

    def num_waiting(self) -> int:
        return self.inner.num_waiting()

    def waiting_by_client(self) -> dict[str, int]:
        return self.inner.waiting_by_client()

    def select(self, budget: AdmissionBudget, now: float) -> list[Request]:
        return self.inner.select(budget, now)

    def on_prefill(self, req: Request, computed: int, cached: int, now: float) -> float:
        return self.inner.on_prefill(req, computed, cached, now)

    def on_decode_step(self, running: list[Request], now: float) -> float:
        return self.inner.on_decode_step(running, now)

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> float:
        return self.inner.on_finish(finished, batch, now)

    def on_abort(self, req: Request, now: float) -> float:
        return self.inner.on_abort(req, now)

    def on_preempt(self, req: Request, now: float) -> None:
        self.inner.on_preempt(req, now)

    def choose_victim(self, running: list[Request], now: float) -> Request:
        return self.inner.choose_victim(running, now)

    def victim_order(self, running: list[Request], now: float) -> list[Request]:
        return self.inner.victim_order(running, now)

    def victim_order_after(self, running: list[Request], steps: int, now: float) -> list[Request] | None:
        return self.inner.victim_order_after(running, steps, now)

    # -- the ledger -------------------------------------------------------------------------------
    def counter_of(self, client: str) -> float:
        return self.inner.counter_of(client)

    def counters(self) -> dict[str, float]:
        return self.inner.counters()

    def weight_of(self, client: str) -> float:
        return self.inner.weight_of(client)

    def set_weight(self, client: str, weight: float) -> None:
        self.inner.set_weight(client, weight)

    def adjust(self, client: str, delta: float) -> None:
        self.inner.adjust(client, delta)

    def set_counter(self, client: str, value: float) -> None:
        self.inner.set_counter(client, value)

    def forget(self, client: str, now: float) -> bool:
        return self.inner.forget(client, now)

    # -- the look-ahead ---------------------------------------------------------------------------
    def charge_steps(self, running: list[Request], steps: int, now: float) -> bool:
        return self.inner.charge_steps(running, steps, now)

    def heads(self, running: list[Request], steps: int, budget: AdmissionBudget) -> list[tuple[int, Request]] | None:
        return self.inner.heads(running, steps, budget)

    def queues_behind(self, req: Request) -> bool:
        return self.inner.queues_behind(req)
