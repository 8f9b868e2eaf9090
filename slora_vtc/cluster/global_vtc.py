"""Global VTC: requests wait at the router in per-client queues, and the client with the least
service across the whole cluster goes next, to a replica with room.

Pull-based: every replica's engine schedules through a view of ONE shared scheduler (the run's
--scheduler, a VTC for the fair share), so a replica with room pulls the least-counter client's
request with its own admission budget, and each engine keeps charging token by token into the
shared counters: the counters are the cluster's service, exactly, at every step. With
`routers` = K > 1 the shared scheduler is a RouterGroup: K routers, each with its own counters,
synchronised every `sync_s` seconds.
"""

import math

from slora_vtc.cluster.router import AdmitHook, NewScheduler, Router, RouterOptions, largest_pool
from slora_vtc.cluster.router_group import Ingress, RouterGroup
from slora_vtc.cluster.shared import SharedView
from slora_vtc.engine import Engine
from slora_vtc.errors import UserError
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler


class GlobalVTC(Router):
    """One cluster-wide queue (or K synchronised ones) that the replicas pull from."""

    pulls = True
    instances = True

    def __init__(self, options: RouterOptions):
        self.options = options
        self.shared: Scheduler | None = None
        self.group: RouterGroup | None = None  # with several routers: the shared scheduler

    def schedulers(self, n: int, new_scheduler: NewScheduler, on_admit: AdmitHook) -> list[Scheduler]:
        self.shared = self._shared(new_scheduler)
        return [SharedView(self.shared, i, on_admit) for i in range(n)]

    def _shared(self, new_scheduler: NewScheduler) -> Scheduler:
        o = self.options
        if o.routers == 1:
            return new_scheduler()
        routers = [new_scheduler() for _ in range(o.routers)]
        if not all(r.traits.shareable for r in routers):
            raise UserError(
                f"--routers {o.routers}: each router keeps VTC counters, so --scheduler must be a VTC "
                "(vtc, wvtc, lcf, vtc-...)"
            )
        self.group = RouterGroup(routers, Ingress(o.routers, o.clients, o.ingress_skew, o.seed), o.sync_s)
        return self.group

    def next_own_event(self) -> float:
        return math.inf if self.group is None else self.group.next_sync()

    def route(self, req: Request, engines: list[Engine]) -> int:
        return largest_pool(engines)  # its admission check; replicas with room then pull it
