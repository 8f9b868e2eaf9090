"""N engines behind one router, simulated event by event.

Every replica is an Engine with its own pool, scheduler, backend and virtual clock. The loop
keeps the replicas that have work in a heap by clock and always handles the earliest event: an
arrival at time t goes to the router once every replica with work has reached t (so it is
dispatched in time order, as one engine sees it: after the step during which it arrived); else
the replica whose clock is earliest takes one step. An idle replica's clock stands still until
something concerns it: a request dispatched to it at t moves it to t first, so it cannot start
before its arrival. Each event costs O(log N).

Pull routers (global VTC) keep requests in their own queue: an arrival wakes one idle replica,
which pulls what it can; a replica that pulls nothing stays idle until the next arrival, or the
next admission or preemption anywhere (which change what heads the queue).

With one replica the loop makes the same calls in the same order as Engine.run.
"""

import heapq
import math
from collections.abc import Callable, Iterable

from slora_vtc.cluster.router import NewScheduler, Router
from slora_vtc.engine import EndHook, Engine, Horizon
from slora_vtc.request import Request

StepHook = Callable[[int], None]  # called with the replica's index after each of its steps


class Cluster:
    """Replicas behind a router (module docstring: the event loop)."""

    def __init__(self, engines: list[Engine], router: Router):
        self.engines = engines
        self.router = router
        self.replica_of: dict[int, int] = {}  # rid -> the replica it was routed to (push) or last admitted by (pull)
        for engine in engines:
            engine.on_end = self._end_hook(engine.on_end)
        self._active = [False] * len(engines)
        self._idle: set[int] = set(range(len(engines)))
        self._heap: list[tuple[float, int]] = []
        self._idle_tried: set[int] = (
            set()
        )  # pull: idle replicas that found nothing to pull since the queue last changed

    @classmethod
    def build(
        cls, router: Router, make_engine: Callable[[int, object], Engine], n: int, new_scheduler: NewScheduler
    ) -> "Cluster":
        """`make_engine(i, scheduler)` builds replica i around the scheduler the router gives it."""
        holder: list[Cluster] = []
        schedulers = router.schedulers(n, new_scheduler, lambda req, i: holder[0]._admitted(req, i))
        cluster = cls([make_engine(i, s) for i, s in enumerate(schedulers)], router)
        holder.append(cluster)
        return cluster

    def _end_hook(self, inner: EndHook | None) -> EndHook:
        def ended(req: Request) -> None:
            self.router.on_end(req, self.replica_of.get(req.rid, -1))
            if inner:
                inner(req)

        return ended

    def _admitted(self, req: Request, i: int) -> None:
        self.replica_of[req.rid] = i
        self._idle_tried.clear()

    @property
    def now(self) -> float:
        """The latest replica clock: how long the run has taken."""
        return max(e.clock.now() for e in self.engines)

    # -- the loop -------------------------------------------------------------------------
    def run(
        self, requests: Iterable[Request], until: float | None = None, on_step: StepHook | None = None
    ) -> list[Request]:
        """Serve requests arriving at their `arrival` times until every one has ended (or abort
        what is left at `until`). Requests without a number (rid < 0) get one, unique in the cluster.
        `on_step`, if given, sees every single step (no macro-steps then)."""
        pending = sorted(requests, key=lambda r: r.arrival)
        self._number(pending)
        self._plan(pending)
        end = math.inf if until is None else until
        nxt = 0
        while True:
            t_step = self._heap[0][0] if self._heap else math.inf
            t_arrival = pending[nxt].arrival if nxt < len(pending) else math.inf
            t = min(t_step, t_arrival)
            if t == math.inf:
                break
            if t >= end:
                self._stop(f"the run ended at {until:g} s", pending[nxt:])
                break
            if t_arrival <= t_step:
                self._dispatch(pending[nxt], nxt)
                nxt += 1
            else:
                i = heapq.heappop(self._heap)[1]
                if on_step:
                    self._step(i, None, None, on_step)
                else:
                    self._step(i, self._next_event(i, nxt, t_arrival, end), self._horizon(i, end), None)
            if self.router.pulls:
                self._wake_for_queue(t)
        self._check_drained()
        return pending

    def _plan(self, pending: list[Request]) -> None:
        """A router whose choice depends on nothing but the requests routes them all up front, so
        that each replica knows when its own next request comes (and may decode ahead until then,
        or past it where the request queues behind: Engine.arrival_horizon)."""
        self._targets: list[int] | None = None
        if self.router.stateless:
            self._targets = [self.router.route(req, self.engines) for req in pending]
            self._own: list[list[Request]] = [[] for _ in self.engines]  # each replica's requests, by arrival
            for req, i in zip(pending, self._targets):
                self._own[i].append(req)
            self._own_next = [0] * len(self.engines)  # of each, the first not yet dispatched

    def _next_event(self, i: int, nxt: int, t_arrival: float, end: float) -> float:
        """The earliest time something from outside may change replica i: its next request (any
        request, unless routed up front), under a pull router the next step of any other replica
        (it changes the shared queue and counters), and what the router does by itself."""
        if self._targets is not None:
            own, k = self._own[i], self._own_next[i]
            t_arrival = own[k].arrival if k < len(own) else math.inf
        if self.router.pulls and self._heap:
            t_arrival = min(t_arrival, self._heap[0][0])
        return min(t_arrival, self.router.next_own_event(), end)

    def _number(self, requests: list[Request]) -> None:
        next_rid = max((r.rid for r in requests), default=-1) + 1
        for req in requests:
            if req.rid < 0:
                req.rid, next_rid = next_rid, next_rid + 1

    def _dispatch(self, req: Request, n: int) -> None:
        if self._targets is None:
            i = self.router.route(req, self.engines)
        else:
            i = self._targets[n]
            self._own_next[i] += 1
        engine = self.engines[i]
        if not self.router.pulls:
            self.replica_of[req.rid] = i
        if not self._active[i]:
            engine.clock.wait_until(req.arrival)
        engine.add_request(req)
        if self.router.pulls:
            self._idle_tried.clear()
        elif not self._active[i] and engine.busy:
            self._activate(i)

    def _horizon(self, i: int, end: float) -> Horizon | None:
        """Replica i's Engine.step horizon: where its requests are routed up front, its own."""
        if self._targets is None:
            return None
        return self.engines[i].arrival_horizon(self._own[i], self._own_next[i], end)

    def _step(self, i: int, next_event: float | None, horizon: Horizon | None, on_step: StepHook | None) -> None:
        engine = self.engines[i]
        waiting = engine.scheduler.num_waiting() if self.router.pulls else 0  # the shared queue's, before
        if engine.step() if next_event is None else engine.step(next_event, horizon):
            if self.router.pulls and engine.scheduler.num_waiting() > waiting:
                self._idle_tried.clear()  # it preempted: what heads the shared queue may fit elsewhere
            heapq.heappush(self._heap, (engine.clock.now(), i))
            if on_step:
                on_step(i)
        else:
            self._active[i] = False
            self._idle.add(i)
            self._idle_tried.add(i)

    def _activate(self, i: int) -> None:
        self._active[i] = True
        self._idle.discard(i)
        heapq.heappush(self._heap, (self.engines[i].clock.now(), i))

    def _wake_for_queue(self, t: float) -> None:
        """Pull routers: while requests wait at the router, an idle replica that has not yet
        tried since the queue changed takes a look, at time t."""
        if not self._idle or self.engines[0].scheduler.num_waiting() == 0:
            return
        i = min((i for i in self._idle if i not in self._idle_tried), default=None)
        if i is not None:
            self.engines[i].clock.wait_until(t)
            self._idle_tried.add(i)
            self._activate(i)

    def _stop(self, reason: str, not_arrived: list[Request]) -> None:
        for engine in self.engines:
            engine.stop(reason)
        if not_arrived:
            self.engines[0].stop(reason, not_arrived)
        self._heap.clear()

    def _check_drained(self) -> None:
        if any(e.busy for e in self.engines):
            raise RuntimeError("a scheduler keeps requests waiting while its replica is idle")

    def flush(self) -> None:
        """Empty every replica's prefix cache (what no request holds)."""
        for e in self.engines:
            e.memory.flush()
