"""One scheduler shared by every replica: each replica's engine gets a view of it, so a replica
with room pulls the next request the shared scheduler picks, with its own admission budget, and
every charge goes to the shared counters."""

from dataclasses import replace

from slora_vtc.cluster.router import AdmitHook
from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler, Traits
from slora_vtc.sched.delegating import Delegating


class SharedView(Delegating):
    """Replica `index`'s window on a shared scheduler: every call goes through to it; an admission
    is reported to the cluster (`on_admit`). Its look-ahead is off: other replicas charge the same
    counters between this replica's steps, so its decode steps are never alike in advance."""

    def __init__(self, shared: Scheduler, index: int, on_admit: AdmitHook):
        super().__init__(shared)
        self.index = index
        self._on_admit = on_admit

    @property
    def traits(self) -> Traits:
        return replace(self.inner.traits, lookahead=False)

    def select(self, budget: AdmissionBudget, now: float) -> list[Request]:
        admitted = self.inner.select(budget, now)
        for req in admitted:
            self._on_admit(req, self.index)
        return admitted

    def pop(self, req: Request, now: float) -> None:
        self.inner.pop(req, now)
        self._on_admit(req, self.index)
