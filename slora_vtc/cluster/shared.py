"""One scheduler shared by every replica: each replica's engine gets a view of it, so a replica
with room pulls the next request the shared scheduler picks, with its own admission budget, and
every charge goes to the shared counters."""

from slora_vtc.cluster.router import AdmitHook
from slora_vtc.memory.admission import Budget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler


class SharedView(Scheduler):
    """Replica `index`'s window on a shared scheduler: every call goes through to it."""

    def __init__(self, shared: Scheduler, index: int, on_admit: AdmitHook):
        self.shared = shared
        self.index = index
        self._on_admit = on_admit

    def on_arrival(self, req: Request, now: float) -> bool:
        return self.shared.on_arrival(req, now)

    def select(self, budget: Budget, now: float) -> list[Request]:
        admitted = self.shared.select(budget, now)
        for req in admitted:
            self._on_admit(req, self.index)
        return admitted

    def num_waiting(self) -> int:
        return self.shared.num_waiting()

    def drain(self) -> list[Request]:
        return self.shared.drain()

    def on_decode_step(self, running: list[Request], now: float) -> None:
        self.shared.on_decode_step(running, now)

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> None:
        self.shared.on_finish(finished, batch, now)

    def remove(self, req: Request) -> bool:
        return self.shared.remove(req)

    def on_abort(self, req: Request, now: float) -> None:
        self.shared.on_abort(req, now)

    def on_preempt(self, req: Request, now: float) -> None:
        self.shared.on_preempt(req, now)

    def choose_victim(self, running: list[Request], now: float) -> Request:
        return self.shared.choose_victim(running, now)

    @property
    def supports_preemption(self) -> bool:
        return self.shared.supports_preemption

    def waiting_by_client(self) -> dict[str, int]:
        return self.shared.waiting_by_client()

    def counters(self) -> dict[str, float]:
        return self.shared.counters()
