"""K router instances, each a VTC with its own queues and counters, in front of one cluster: the
per-router-replica deployment of llm-d's flow control and Dynamo's DRR, where a client's share
depends on which router its requests came through (Dynamo's DEP #15187: two frontends, skewed
ingress, a 4:1 policy served about 1:1).

Ingress: a request goes to its client's home router (client index mod K) with probability
`skew`, to a router drawn at random otherwise. Dispatch: a replica with room asks the routers in
turn, starting after the last one that dispatched. A router dispatches its least-counter client
unless a client waiting at another router had, in its view, a smaller counter; when every
router with work declines, the first asked dispatches (no router holds work back from an idle
cluster). A router's view: the cluster-wide counters at the last synchronisation plus the
charges of the requests it dispatched since. Every `sync_s` seconds the routers exchange their
charges: each counter becomes the cluster-wide total (the last total plus every router's
increase since), and each router learns which clients wait elsewhere. Without sync a router
knows only its own clients and never declines, so the replicas are shared out among routers,
not clients. With one router this is exactly global VTC.

Cost: each dispatch decision scans the clients waiting elsewhere (O(clients)); each sync is
O(routers x clients). This is for experiments on the failure, not for 10,000 clients.
"""

import math
from collections.abc import Callable

from slora_vtc.memory.budget import UNLIMITED, AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler, Traits, arrival_key
from slora_vtc.sched.ledger import Ledger


class Ingress:
    """Which router a request enters by: its client's home router with probability `skew`, else
    one drawn at random (seeded; not in turn, which interleaved clients would turn into a skew)."""

    def __init__(self, routers: int, clients: tuple[str, ...], skew: float, seed: int):
        self.routers, self.skew = routers, skew
        self._index = {c: i for i, c in enumerate(clients)}
        import numpy as np  # only for a router group

        self._rng = np.random.default_rng(seed)

    def __call__(self, req: Request) -> int:
        if self.skew > 0 and self._rng.random() < self.skew:
            return self._index.setdefault(req.client, len(self._index)) % self.routers
        return int(self._rng.integers(self.routers))


class RouterGroup(Scheduler, Ledger):
    """K least-counter-first routers (each `Traits.shareable`) with periodic counter synchronisation
    (module docstring). Every call goes to the router a request entered by."""

    traits = Traits(ledger=True, weights=True, preemption=True)

    def __init__(self, routers: list[Scheduler], ingress: Callable[[Request], int], sync_s: float | None):
        self.routers = routers
        self.ingress = ingress
        self.sync_s = sync_s
        self.syncs = 0
        self._next_sync = math.inf if sync_s is None else sync_s
        self._owner: dict[int, int] = {}  # rid -> the router it entered by
        self._turn = 0
        self._totals: dict[str, float] = {}
        self._elsewhere: list[set[str]] = [set() for _ in routers]

    # -- synchronisation ------------------------------------------------------------------------
    def _maybe_sync(self, now: float) -> None:
        if now < self._next_sync:
            return
        self._sync()
        # sync_s = 0: every call syncs
        self._next_sync = now if self.sync_s == 0 else (math.floor(now / self.sync_s) + 1) * self.sync_s

    def next_sync(self) -> float:
        """When the routers next exchange their counters by the clock (inf: never, or at every call).
        A replica's macro-step must not charge steps that start after it at once with those before."""
        return math.inf if self.sync_s == 0 else self._next_sync

    def totals(self) -> dict[str, float]:
        """Cluster-wide counters: the last totals plus each router's increase since."""
        names = {c for r in self.routers for c in r.counters()}
        last = self._totals
        return {c: last.get(c, 0.0) + sum(r.counter_of(c) - last.get(c, 0.0) for r in self.routers) for c in names}

    def _sync(self) -> None:
        self._totals = self.totals()
        for r in self.routers:
            for client, value in self._totals.items():
                r.set_counter(client, value)
        waiting = [{c for c, n in r.waiting_by_client().items() if n} for r in self.routers]
        self._elsewhere = [set().union(*(w for j, w in enumerate(waiting) if j != k)) for k in range(len(self.routers))]
        self.syncs += 1

    # -- dispatch: which router's least-counter client goes next -----------------------------------
    def _dispatcher(self) -> int | None:
        k_all = len(self.routers)
        asked = [(self._turn + i) % k_all for i in range(k_all)]
        with_work = [k for k in asked if self.routers[k].num_waiting()]
        for k in with_work:
            if self._least_served_here(k):
                return k
        return with_work[0] if with_work else None

    def _least_served_here(self, k: int) -> bool:
        router = self.routers[k]
        best = router.peek(UNLIMITED).client
        mine = router.counter_of(best)
        return all(mine <= router.counter_of(c) for c in self._elsewhere[k] if c != best)

    def select(self, budget: AdmissionBudget, now: float) -> list[Request]:
        self._maybe_sync(now)  # once per round, before its first dispatch
        return super().select(budget, now)

    def peek(self, budget: AdmissionBudget) -> Request | None:
        k = self._dispatcher()
        return None if k is None else self.routers[k].peek(budget)

    def pop(self, req: Request, now: float) -> None:
        k = self._owner[req.rid]
        self.routers[k].pop(req, now)
        self._turn = (k + 1) % len(self.routers)

    # -- the rest of the core, by owner ------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> bool:
        self._maybe_sync(now)
        k = self.ingress(req)
        self._owner[req.rid] = k
        return self.routers[k].on_arrival(req, now)

    def _by_owner(self, requests: list[Request]) -> list[list[Request]]:
        groups: list[list[Request]] = [[] for _ in self.routers]
        for req in requests:
            groups[self._owner[req.rid]].append(req)
        return groups

    def on_prefill(self, req: Request, computed: int, cached: int, now: float) -> float:
        return self.routers[self._owner[req.rid]].on_prefill(req, computed, cached, now)

    def on_decode_step(self, running: list[Request], now: float) -> float:
        self._maybe_sync(now)
        return sum(
            router.on_decode_step(group, now) for router, group in zip(self.routers, self._by_owner(running)) if group
        )

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> float:
        charged = 0.0
        for router, done, part in zip(self.routers, self._by_owner(finished), self._by_owner(batch)):
            if part:
                charged += router.on_finish(done, part, now)
        for req in finished:
            self._owner.pop(req.rid, None)
        return charged

    def on_abort(self, req: Request, now: float) -> float:
        return self.routers[self._owner.pop(req.rid)].on_abort(req, now)

    def on_preempt(self, req: Request, now: float) -> None:
        self.routers[self._owner[req.rid]].on_preempt(req, now)

    def choose_victim(self, running: list[Request], now: float) -> Request:
        """Each router's victim among its own requests; of those, the largest counter (then the latest)."""
        victims = [r.choose_victim(group, now) for r, group in zip(self.routers, self._by_owner(running)) if group]
        return max(victims, key=self._victim_key)

    def victim_order(self, running: list[Request], now: float) -> list[Request]:
        """choose_victim's order: each router's own order, merged by the key choose_victim compares."""
        orders = [r.victim_order(group, now) for r, group in zip(self.routers, self._by_owner(running)) if group]
        merged = []
        while orders:
            i = max(range(len(orders)), key=lambda k: self._victim_key(orders[k][0]))
            merged.append(orders[i].pop(0))
            if not orders[i]:
                del orders[i]
        return merged

    def victim_order_after(self, running: list[Request], steps: int, now: float) -> list[Request] | None:
        return None  # the merge compares the routers' counters, which the steps would change

    def _victim_key(self, victim: Request) -> tuple:
        """Of the routers' victims, the largest counter (its own router's), then the latest arrival."""
        return (self.routers[self._owner[victim.rid]].counter_of(victim.client), arrival_key(victim))

    def remove(self, req: Request) -> bool:
        k = self._owner.get(req.rid)
        if k is None or not self.routers[k].remove(req):
            return False
        del self._owner[req.rid]
        return True

    def num_waiting(self) -> int:
        return sum(r.num_waiting() for r in self.routers)

    def drain(self) -> list[Request]:
        drained = [req for r in self.routers for req in r.drain()]
        for req in drained:
            self._owner.pop(req.rid, None)
        return drained

    def waiting_by_client(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for r in self.routers:
            for c, n in r.waiting_by_client().items():
                merged[c] = merged.get(c, 0) + n
        return merged

    # -- the ledger: the cluster-wide totals ---------------------------------------------------------
    def counters(self) -> dict[str, float]:
        return self.totals()

    def counter_of(self, client: str) -> float:
        last = self._totals.get(client, 0.0)
        return last + sum(r.counter_of(client) - last for r in self.routers)

    def weight_of(self, client: str) -> float:
        return self.routers[0].weight_of(client)

    def set_weight(self, client: str, weight: float) -> None:
        for r in self.routers:
            r.set_weight(client, weight)

    def adjust(self, client: str, delta: float) -> None:
        """A correction counts once in the totals: it goes to the first router."""
        self.routers[0].adjust(client, delta)

    def set_counter(self, client: str, value: float) -> None:
        self._totals[client] = value
        for r in self.routers:
            r.set_counter(client, value)

    def forget(self, client: str, now: float) -> bool:
        """Nothing is dropped: synchronising needs every client's last total (clusters never forget)."""
        return True
