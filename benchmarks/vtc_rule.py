"""The event-driven rule (event_rule.py) under VTC: our VTC scheduler itself decides (lifts,
admission order, prompt charges and their refunds, readmission charges), while decode charges are
kept per client between events, as an event-driven engine would keep them. A yardstick for
benchmarks/chunked_lean.py, not part of the package.

A decoding request is charged w_q per token before each tick (VTC's linear cost with whole weights
and unit client weights, as its exact look-ahead assumes: sched/vtc_lookahead.py), so between two
events each client's counter grows by w_q times its decoding requests per tick: the counters are
brought up to date at each event (`_sync`), in O(clients), and a decoding request's record of what
it was charged only when it is preempted (VTC reads it at the readmission). Where the running list is
sorted victims last (a tick that may preempt), VTC's order is the smallest counter first, then the
earliest arrival: the requests short of a block are served in it, and the victim is the latest
decoding arrival of the client with the largest counter.
"""

from bisect import bisect_left, insort

from event_rule import EventRule
from lean_rule import Seq

from slora_vtc.backends.sim import StepTimeModel
from slora_vtc.config import EngineConfig
from slora_vtc.sched.prompt_charge import PromptProgress
from slora_vtc.sched.vtc import VTC
from slora_vtc.sched.vtc_lookahead import _overtakes


class SchedulerQueue:
    """The waiting requests as our VTC keeps them (its client queues and heap), behind lean_rule's
    Waiting calls."""

    def __init__(self, rule: "VTCRule"):
        self.rule, self.vtc = rule, rule.vtc

    def __bool__(self) -> bool:
        return self.vtc.num_waiting() > 0

    def head(self) -> Seq:
        return self.rule.seqs_by_rid[self.vtc.peek(None).rid]

    def pop(self) -> Seq:
        s = self.head()
        self.vtc.pop(s.req, self.rule.now)
        return s

    def push(self, s: Seq) -> None:  # a preempted request
        s.req.generated = s.generated
        self.vtc.on_preempt(s.req, self.rule.now)


class VTCRule(EventRule):
    """EventRule's ticks with our VTC deciding and decode charges kept per client (module docstring)."""

    def __init__(self, config: EngineConfig, model: StepTimeModel, vtc: VTC):
        super().__init__(config, model)
        self.vtc, self.w_q = vtc, vtc.decode_token_charge
        if self.w_q is None or vtc.refunds or vtc.weights:
            raise ValueError("vtc_rule.py charges decodes per client: VTC's linear cost, whole weights, no refunds")
        self.waiting = SchedulerQueue(self)
        self.seqs_by_rid: dict[int, Seq] = {}
        self.decoding_by_client: dict[str, list[Seq]] = {}  # in arrival order
        self.synced = 0  # ticks whose decodes are charged
        self.prompts: dict[int, PromptProgress] = {}
        self.sort_counters: dict[str, float] = {}  # the counters the running list was last sorted by

    # -- arrivals and ends --------------------------------------------------------------------------
    def _add(self, s: Seq) -> None:
        self._sync()  # a lift reads the counters of its time
        super()._add(s)

    def _arrive(self, s: Seq) -> None:
        self.seqs_by_rid[s.rid] = s
        self.vtc.on_arrival(s.req, self.now)

    def _finished(self, s: Seq) -> None:
        self.vtc.on_finish([s.req], [], self.now)
        self.prompts.pop(s.rid, None)
        super()._finished(s)

    def _preempt(self, s: Seq) -> None:
        if not s.prefilling:  # its last decode tick charged the token it made: VTC reads that at readmission
            self.vtc.records[s.rid].charged = s.generated
        super()._preempt(s)

    # -- decoding requests and their charges --------------------------------------------------------
    def _start_decoding(self, s: Seq) -> None:
        super()._start_decoding(s)
        insort(self.decoding_by_client.setdefault(s.client, []), s, key=Seq.key)

    def _stop_decoding(self, s: Seq) -> None:
        super()._stop_decoding(s)
        members = self.decoding_by_client[s.client]
        del members[bisect_left(members, s.key(), key=Seq.key)]

    def _sync(self, through: int | None = None) -> None:
        """Charge the decodes of the ticks before `through` (default: this one) not charged yet."""
        through = self.tick if through is None else through
        ticks, clients = through - self.synced, self.vtc.clients
        if ticks:
            for client, members in self.decoding_by_client.items():
                if members:
                    clients[client].counter += self.w_q * len(members) * ticks
            self.synced = through

    def _charge_chunks(self, chunks: list[tuple[Seq, int, int]]) -> None:
        """The engine's prompt charges (chunked.py): a chunk reports the prefill so far, a request back
        from a preemption with tokens is charged once, at its admission."""
        for s, start, length in chunks:
            s.req.generated = s.generated
            if s.generated:
                if not start:
                    self.vtc.on_prefill(s.req, s.prompt + s.generated, 0, self.now)
                continue
            progress = self.prompts.setdefault(s.rid, PromptProgress(0))
            progress.report(self.vtc, s.req, start + length, self.now)

    def _charge_event(self, chunks: list[tuple[Seq, int, int]]) -> None:
        self._charge_chunks(chunks)
        self._sync(self.tick + 1)  # this tick's decodes, by those decoding after its scheduling

    def _charge(self, chunks: list[tuple[Seq, int, int]], decodes: list[Seq]) -> None:
        """An explicit tick's charges (every running request counted explicitly there)."""
        self._charge_chunks(chunks)
        clients = self.vtc.clients
        for s in decodes:
            clients[s.client].counter += self.w_q
            self.vtc.records[s.rid].charged = s.generated + 1
        self.synced = self.tick + 1

    # -- the order VTC sorts the running list in ------------------------------------------------------
    def _victims_last_key(self, s: Seq) -> tuple[float, float, int]:
        """VTC's victim order reversed, by today's counters: the smallest counter, the earliest arrival first."""
        return self.vtc.clients[s.client].counter, s.arrival, s.rid

    def _order_victims_last(self) -> None:
        self.running.sort(key=self._victims_last_key)

    def _sorted(self, tick: int) -> None:
        super()._sorted(tick)
        ahead, clients = tick - self.synced, self.vtc.clients
        self.sort_counters = {name: c.counter for name, c in clients.items()}
        for client, members in self.decoding_by_client.items():
            self.sort_counters[client] += self.w_q * len(members) * ahead

    def _list_position(self, s: Seq) -> tuple:
        if s.admitted < self.sorted_below:
            return 0, self.sort_counters[s.client], s.arrival, s.rid
        return 1, s.admitted, 0, 0

    def _serve_order(self, short: list[Seq]) -> list[Seq]:
        return sorted(short, key=self._victims_last_key)

    def _victim(self) -> Seq:
        clients = self.vtc.clients
        best = max((clients[c].counter, *m[-1].key(), c) for c, m in self.decoding_by_client.items() if m)
        return self.decoding_by_client[best[-1]][-1]

    # -- quiet runs -----------------------------------------------------------------------------------
    def _head_costs(self, ticks: int) -> list[tuple[int, int]]:
        """VTC's head in each quiet tick: the waiting client with the least counter, each growing by
        w_q per decoding request per tick, until a slower one overtakes it (sched/vtc_lookahead.py)."""
        ahead = self.tick - self.synced  # ticks not charged yet
        waiting = []
        for name, c in self.vtc.queued.items():
            rate = self.w_q * len(self.decoding_by_client.get(name, ()))
            waiting.append((int(c.counter) + rate * ahead, c.order, rate, c))
        found, s = [], 0
        while s < ticks:
            best = min(waiting, key=lambda w, s=s: (w[0] + w[2] * s, w[1]))
            found.append((s, self._admission_cost(self.seqs_by_rid[best[3].queue[0].rid])))
            s = min([_overtakes(w, best) for w in waiting if w[2] < best[2]], default=ticks)
        return found or [(0, None)]

    def _stops_at(self, arriving: Seq, admits: bool) -> bool:
        """Unless its client has requests waiting, an arrival is lifted to counters of its time."""
        return not self.vtc.queues_behind(arriving.req)
