"""vLLM's step rule under FCFS without the prefix cache, event-driven: the lean rule (lean_rule.py)
with nothing done per decoding request between events. A yardstick for what our engine's chunked
batching could reach (benchmarks/chunked_lean.py), not part of the package.

Ticks are the engine's steps, counted. A decoding request's counts are offsets from the tick it
began decoding at (`Seq.t0`): at the start of tick T it has generated `generated + T - t0` tokens.
What a tick needs of the decoding requests is kept as they start and stop decoding, never per tick:

- `by_phase[k]`: those whose last block is full at the start of each tick T with T = k (mod block
  size): they take a block in those ticks. In FCFS order, the order in which a tick short of blocks
  serves them.
- `order`: all of them in FCFS order; the victim of a preemption is the last.
- `finishes`: a heap of the tick in which each makes its last token (stale entries skipped).
- `context`: the sum of their prompt and generated tokens (the step-time model's context), which
  grows by their number each tick.

A quiet tick (no finish, the blocks it takes free, nobody admitted) costs a few additions, and a run
of them is one loop. Any other tick is an event, done in O(log n) but for a preemption's victims and
the tick's requests short of a block. The running list's order, which the rule reads only in a tick
that may preempt or where the budget does not cover every running request, is FCFS order for those
admitted before the last tick that sorted it (victims last: vLLM's order with our plugin), then the
later admissions in turn; it is built only for a tick with a prompt mid-prefill whose budget or
blocks do not cover every running request, which then runs as the lean rule's explicit step.
"""

import heapq
from bisect import bisect_left, insort

from lean_rule import LeanRule, Seq

from slora_vtc.backends.sim import StepTimeModel
from slora_vtc.config import EngineConfig
from slora_vtc.request import Request
from slora_vtc.sched.victims import may_preempt


class EventRule(LeanRule):
    """LeanRule's steps, with a decoding request's counts as offsets from the tick (module docstring)."""

    def __init__(self, config: EngineConfig, model: StepTimeModel):
        super().__init__(config, model, macro=True)
        self.tick = 0
        self.by_phase: list[list[Seq]] = [[] for _ in range(config.block_size)]
        self.order: list[Seq] = []
        self.finishes: list[tuple[int, int, Seq]] = []
        self.context = 0
        self.prefilling: list[Seq] = []  # running requests mid-prefill, counted explicitly
        self.sorted_below = 0  # those admitted before the last tick that sorted the running list

    def run(self, requests: list[Request]) -> dict[int, float]:
        pending = self.seqs = sorted((Seq(r) for r in requests), key=Seq.key)
        nxt = 0
        while nxt < len(pending) or self.waiting or self.order or self.prefilling:
            while nxt < len(pending) and pending[nxt].arrival <= self.now:
                self._add(pending[nxt])
                nxt += 1
            arrival = pending[nxt].arrival if nxt < len(pending) else float("inf")
            if not (self.order or self.prefilling or self.waiting):
                self.now = arrival
            elif self.prefilling or not self.quiet_run(pending, nxt):
                self.event_tick()
        return self.ends

    # -- decoding requests, as offsets ------------------------------------------------------------
    def _start_decoding(self, s: Seq) -> None:
        """s, its prefill complete and its token counted, decodes from this tick on."""
        s.t0, bs = self.tick, self.config.block_size
        s.block_phase = (self.tick - (s.prompt + s.generated - 1)) % bs  # positions computed: prompt + generated - 1
        insort(self.by_phase[s.block_phase], s, key=Seq.key)
        insort(self.order, s, key=Seq.key)
        heapq.heappush(self.finishes, (self._finish_tick(s), s.rid, s))
        self.context += s.prompt + s.generated

    def _stop_decoding(self, s: Seq) -> None:
        """s stops decoding at this tick's start: its counts written out."""
        s.generated += self.tick - s.t0
        s.computed = s.prompt + s.generated - 1
        s.held = self.config.round_up(s.computed)
        for members in (self.by_phase[s.block_phase], self.order):
            del members[bisect_left(members, s.key(), key=Seq.key)]
        self.context -= s.prompt + s.generated
        s.t0 = None

    @staticmethod
    def _finish_tick(s: Seq) -> int:
        return s.t0 + s.out - s.generated - 1

    def _first_finish(self) -> float:
        """The tick in which the first decoding request makes its last token (inf: none decodes)."""
        finishes = self.finishes
        while finishes and (finishes[0][2].t0 is None or finishes[0][0] != self._finish_tick(finishes[0][2])):
            heapq.heappop(finishes)  # it stopped decoding since
        return finishes[0][0] if finishes else float("inf")

    # -- quiet ticks ------------------------------------------------------------------------------
    def quiet_run(self, pending: list[Seq], nxt: int) -> bool:
        """The ticks from now in which the decoding requests only decode (no finish, no block short,
        nobody admitted, up to the first tick ending at or after an arrival that could change that:
        `_stops_at`), at once; False if there are none. pending[nxt:] have not arrived yet."""
        config, bs, n = self.config, self.config.block_size, len(self.order)
        if not n or n > config.max_num_batched_tokens:
            return False
        last = self._first_finish()
        if last == self.tick or len(self.by_phase[self.tick % bs]) * bs > self.free:
            return False  # its first tick is an event
        admits = n < config.max_num_batched_tokens and n < config.max_num_seqs and self.free >= bs
        heads = self._head_costs(last - self.tick) if admits and self.waiting else [(0, None)]
        head, head_cost = 0, heads[0][1]  # heads: (first tick from now, the head's admission cost)
        until = pending[nxt].arrival if nxt < len(pending) else float("inf")  # the next arrival to look at
        d, e, f = self.model.decode_coef
        fixed, overhead = d + e * max(0, n - self.model.decode_knee), self.model.overhead_s
        by_phase, free, tick, context, now = self.by_phase, self.free, self.tick, self.context, self.now
        need = 0
        while tick < last:
            while head + 1 < len(heads) and heads[head + 1][0] <= tick - self.tick:
                head += 1
                head_cost = heads[head][1]
            need = len(by_phase[tick % bs]) * bs
            if need > free or (head_cost is not None and head_cost <= free - need):
                break
            free -= need
            now += fixed + f * context + overhead  # SimBackend.decode_run's sums, in its order
            context += n
            tick += 1
            if now >= until:  # arrivals by now: is one to stop at?
                while nxt < len(pending) and pending[nxt].arrival <= now and not self._stops_at(pending[nxt], admits):
                    nxt += 1
                if nxt < len(pending) and pending[nxt].arrival <= now:
                    break
                until = pending[nxt].arrival if nxt < len(pending) else float("inf")
        if tick == self.tick:
            return False
        last_tick = tick - 1
        if n > 1 and may_preempt((free + need) // bs, config.max_num_batched_tokens, bs, n):
            self._sorted(last_tick)  # its last tick sorted the running list
        self.events["macro"] += 1
        self.events["steps"] += tick - self.tick
        self.free, self.tick, self.context, self.now = free, tick, context, now
        return True

    # -- events -----------------------------------------------------------------------------------
    def event_tick(self) -> None:
        """One tick where something happens: prompts' next chunks, blocks for the requests short of
        one (preempting from the end of FCFS order), admissions, finishes."""
        config, bs, budget = self.config, self.config.block_size, self.config.max_num_batched_tokens
        n, short = len(self.order), self.by_phase[self.tick % bs]
        rest = [s.prompt + s.generated - s.computed for s in self.prefilling]
        slots = [config.round_up(s.computed + r) - s.held for s, r in zip(self.prefilling, rest)]
        if n + sum(rest) > budget or (self.prefilling and len(short) * bs + sum(slots) > self.free):
            return self.explicit_tick()  # the running list's order decides who is served
        self._sync()
        running = n + len(self.prefilling)
        if running > 1 and may_preempt(self.free // bs, budget, bs, running):
            self._sorted(self.tick)
        chunks = []
        for s, r, grown in zip(self.prefilling, rest, slots):
            s.held += grown
            chunks.append((s, s.computed, r))
            s.computed += r
        self.free -= sum(slots)
        preempted = self._grow_short(short)
        decodes = len(self.order)
        if not preempted:
            chunks += self._admit(budget - decodes - sum(rest), decodes + len(self.prefilling))
        if not chunks and not decodes:
            return  # every running request was preempted: no forward pass
        tokens, pairs = sum(c for _, _, c in chunks), sum(c * start for _, start, c in chunks)
        self._charge_event(chunks)
        self._advance(self.model.mixed_time(tokens, pairs, decodes, self.context))
        self.events["single"] += 1
        self.events["steps"] += 1
        self.context += decodes
        self.tick += 1
        self.prefilling = []
        for s, _, _ in chunks:
            if s.computed == s.prompt + s.generated:
                self._prefilled(s)
                self._start_decoding(s)
            else:
                self.prefilling.append(s)
        self._end_finished()

    def _grow_short(self, short: list[Seq]) -> bool:
        """Each decoding request whose last block is full takes one, in FCFS order, preempting the
        last of the order while none is free (the list is sorted: a tick short of blocks may
        preempt); returns whether any was preempted."""
        bs = self.config.block_size
        if len(short) * bs <= self.free:
            self.free -= len(short) * bs
            return False
        preempted = False
        for s in self._serve_order(short):
            if s.t0 is None:  # preempted for one before it
                continue
            while bs > self.free:
                victim = self._victim()
                self._stop_decoding(victim)
                self._preempt(victim)
                preempted = True
                if victim is s:
                    return True
            self.free -= bs
        return preempted

    def _end_finished(self) -> None:
        """The decoding requests that made their last token in the tick that just ended."""
        while self._first_finish() < self.tick:
            s = heapq.heappop(self.finishes)[2]
            self._stop_decoding(s)
            self._finished(s)

    def explicit_tick(self) -> None:
        """The lean rule's explicit step on the running list in the engine's order, then back to offsets."""
        self._sync()
        decoding = list(self.order)
        for s in decoding:
            self._stop_decoding(s)
        self.running = sorted(decoding + self.prefilling, key=self._list_position)
        self.prefilling = []
        bs = self.config.block_size
        if len(self.running) > 1 and may_preempt(
            self.free // bs, self.config.max_num_batched_tokens, bs, len(self.running)
        ):
            self._sorted(self.tick)
        steps = self.events["steps"]
        self.single_step()
        self.tick += self.events["steps"] - steps
        for s in self.running:
            if s.prefilling:
                self.prefilling.append(s)
            else:
                self._start_decoding(s)
        self.running = []

    # -- what the scheduler decides (FCFS here; benchmarks/vtc_rule.py: VTC) ---------------------
    def _head_costs(self, ticks: int) -> list[tuple[int, int]]:
        """What the waiting pass's head would take in each of the next `ticks` quiet ticks, as
        (first tick from now, cost) pairs: FCFS's head does not change."""
        return [(0, self._admission_cost(self.waiting.head()))]

    def _stops_at(self, arriving: Seq, admits: bool) -> bool:
        """Whether a quiet run must end at this arrival (it could be admitted)."""
        return admits and not self.waiting

    def _sync(self) -> None:
        """Before an event's decisions: what the ticks since the last event charged (FCFS: nothing)."""

    def _sorted(self, tick: int) -> None:
        """The running list was sorted victims last at `tick`."""
        self.sorted_below = self.admissions

    def _serve_order(self, short: list[Seq]) -> list[Seq]:
        """The decoding requests short of a block, in the running list's order (sorted victims last)."""
        return list(short)

    def _victim(self) -> Seq:
        return self.order[-1]

    def _charge_event(self, chunks: list[tuple[Seq, int, int]]) -> None:
        """An event tick's charges, after its scheduling (FCFS: none)."""

    def _list_position(self, s: Seq) -> tuple:
        return (0, s.arrival, s.rid) if s.admitted < self.sorted_below else (1, s.admitted, 0)
