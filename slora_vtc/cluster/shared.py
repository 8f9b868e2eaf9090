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
    is reported to the cluster (`on_admit`). Of the look-ahead it keeps `charge_steps`: the cluster
    ends a replica's macro-step at the next step of any other replica (Cluster._next_event), so
    nobody reads the shared counters between the steps it charges at once. It names no `heads`:
    among many replicas those macro-steps are a step or two long, and working the heads out for
    each cost more than the steps it saved. Arrivals reach it from the cluster, which other
    replicas' pulls change (`queues_behind`: False). Its traits say that its queue is shared
    (`shared_queue`): what one replica admits or preempts, the others may pull (chunked batching then
    takes single steps)."""

    def __init__(self, shared: Scheduler, index: int, on_admit: AdmitHook):
        super().__init__(shared)
        self.index = index
        self._on_admit = on_admit
        self._traits = replace(shared.traits, shared_queue=True)

    @property
    def traits(self) -> Traits:
        return self._traits

    def select(self, budget: AdmissionBudget, now: float) -> list[Request]:
        admitted = self.inner.select(budget, now)
        for req in admitted:
            self._on_admit(req, self.index)
        return admitted

    def pop(self, req: Request, now: float) -> None:
        self.inner.pop(req, now)
        self._on_admit(req, self.index)

    def heads(self, running: list[Request], steps: int, budget: AdmissionBudget) -> list[tuple[int, Request]] | None:
        return None

    def queues_behind(self, req: Request) -> bool:
        return False
