"""vLLM's step rule cut to what FCFS without the prefix cache needs, simulated: a yardstick for our
engine's chunked batching (benchmarks/chunked_lean.py), not part of the package.

No scheduler interface, no memory manager, no request objects: counts only, in slots, with the
simulator's step-time model. Single steps follow slora_vtc/chunked.py's rule (running requests in
the list's order, a decode or the next prompt chunk each within the token budget, preemption of the
list's last request by recompute when blocks run short, the list sorted victims last first in a step
that may preempt; then waiting requests in FCFS order while their whole prefill fits); with `macro`,
the decode-only steps up to the next event run as one, as our engine's macro-steps do: O(running)
work at each event.
"""

import heapq
from bisect import bisect_left

from slora_vtc.backends.sim import StepTimeModel
from slora_vtc.config import EngineConfig
from slora_vtc.request import Request
from slora_vtc.sched.victims import may_preempt


class Seq:
    """One request of the lean rule: counts only (and, for event_rule.py, where it stands in the ticks)."""

    __slots__ = (
        "arrival", "rid", "adapter", "prompt", "out", "generated", "computed", "held", "prefilling",
        "first_token", "preemptions", "t0", "block_phase", "admitted", "req", "client",
    )  # fmt: skip

    def __init__(self, req: Request):
        self.arrival, self.rid, self.adapter = req.arrival, req.rid, req.adapter
        self.req, self.client = req, req.client  # vtc_rule.py hands the request to our VTC
        self.prompt, self.out = req.prompt_len, req.max_new_tokens
        self.generated = self.computed = self.held = 0  # tokens made; positions with K/V; slots held
        self.prefilling = True
        self.first_token: float | None = None
        self.preemptions = 0
        self.t0: int | None = None  # event_rule: the tick from which it decodes (None: it does not)
        self.admitted = 0  # its number among the admissions, its latest
        self.block_phase = 0  # event_rule: see there

    def key(self) -> tuple[float, int]:
        return self.arrival, self.rid


class Waiting:
    """The waiting requests in FCFS's order (arrival, then id): a heap."""

    def __init__(self):
        self.heap: list[tuple[float, int, Seq]] = []

    def __bool__(self) -> bool:
        return bool(self.heap)

    def head(self) -> Seq:
        return self.heap[0][2]

    def pop(self) -> Seq:
        return heapq.heappop(self.heap)[2]

    def push(self, s: Seq) -> None:
        heapq.heappush(self.heap, (s.arrival, s.rid, s))


class LeanRule:
    """vLLM's step rule under FCFS (the victim: the latest arrival), no prefix cache, simulated."""

    def __init__(self, config: EngineConfig, model: StepTimeModel, macro: bool = True):
        self.config, self.model, self.macro = config, model, macro
        self.free = config.pool_tokens
        self.adapters: dict[str, int] = {}  # resident adapter -> running requests using it
        self.running: list[Seq] = []
        self.waiting = Waiting()
        self.now, self.cold, self.ends = 0.0, True, {}
        self.events = {"single": 0, "macro": 0, "steps": 0}  # single steps, macro-steps, the vLLM steps of both
        self.admissions = 0  # requests admitted so far (Seq.admitted: its number among them)

    def run(self, requests: list[Request]) -> dict[int, float]:
        pending = self.seqs = sorted((Seq(r) for r in requests), key=Seq.key)
        nxt = 0
        while nxt < len(pending) or self.waiting or self.running:
            while nxt < len(pending) and pending[nxt].arrival <= self.now:
                self._add(pending[nxt])
                nxt += 1
            arrival = pending[nxt].arrival if nxt < len(pending) else float("inf")
            if self.macro and self.decode_run(arrival):
                continue
            if not self.single_step():
                if arrival == float("inf"):
                    raise RuntimeError("the lean rule keeps requests waiting while nothing runs")
                self.now = arrival
        return self.ends

    def _add(self, s: Seq) -> None:
        config = self.config
        if config.round_up(s.prompt + s.out - 1) + config.slots_of(s.adapter) > config.pool_tokens:
            self.ends[s.rid] = self.now  # rejected: it can never fit the pool (memory/admission.py's fits_alone)
        else:
            self._arrive(s)

    def _arrive(self, s: Seq) -> None:
        """An arrival the pool could hold joins the waiting requests."""
        self.waiting.push(s)

    # -- single steps: vLLM's rule ----------------------------------------------------------------
    def single_step(self) -> bool:
        config, budget = self.config, self.config.max_num_batched_tokens
        if len(self.running) > 1 and may_preempt(
            self.free // config.block_size, budget, config.block_size, len(self.running)
        ):
            self._order_victims_last()
        chunks, decodes, budget, preempted = self._running_pass(budget)
        if not preempted:
            new = self._admit(budget, len(self.running))
            self.running += [s for s, _, _ in new]
            chunks += new
        if not chunks and not decodes:
            return preempted
        tokens = sum(n for _, _, n in chunks)
        pairs = sum(n * start for _, start, n in chunks)
        context = sum(s.prompt + s.generated for s in decodes)
        self._charge(chunks, decodes)
        self._advance(self.model.mixed_time(tokens, pairs, len(decodes), context))
        self.events["single"] += 1
        self.events["steps"] += 1
        for s, start, n in chunks:
            if start + n == s.prompt + s.generated:
                self._prefilled(s)
        for s in decodes:
            s.generated += 1
        self._retire()
        return True

    def _running_pass(self, budget: int) -> tuple[list, list, int, bool]:
        chunks, decodes, preempted, i, running = [], [], False, 0, self.running
        while i < len(running) and budget > 0:
            s = running[i]
            n = min(s.prompt + s.generated - s.computed, budget) if s.prefilling else 1
            need = self.config.round_up(s.computed + n) - s.held
            while need > self.free:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is s:
                    return chunks, decodes, budget, preempted
            self.free -= need
            s.held += need
            if s.prefilling:
                chunks.append((s, s.computed, n))
            else:
                decodes.append(s)
            s.computed += n
            budget -= n
            i += 1
        return chunks, decodes, budget, preempted

    def _admit(self, budget: int, running: int) -> list[tuple[Seq, int, int]]:
        """The waiting pass: FCFS's head, its first chunk, while the budget, the sequence cap and
        the blocks for its whole prefill allow (vLLM's scheduler_reserve_full_isl); `running`:
        the requests the step already runs."""
        config, waiting, chunks = self.config, self.waiting, []
        while budget > 0 and running < config.max_num_seqs and self.free >= config.block_size and waiting:
            s = waiting.head()
            if self._admission_cost(s) > self.free:
                break
            waiting.pop()
            self._use_adapter(s)
            n = min(s.prompt + s.generated, budget)
            s.held, s.computed, s.prefilling = config.round_up(n), n, True
            self.free -= s.held
            s.admitted, self.admissions = self.admissions, self.admissions + 1
            chunks.append((s, 0, n))
            budget -= n
            running += 1
        return chunks

    def _admission_cost(self, s: Seq) -> int:
        """Slots a waiting request's whole prefill and its adapter take."""
        return self.config.round_up(s.prompt + s.generated) + self._load_cost(s)

    # -- macro-steps: the decode-only steps up to the next event, at once -----------------------
    def decode_run(self, arrival: float) -> bool:
        """Run the decode-only steps that single steps would run alike (none in prefill, none
        admitted, none short of a block, up to the first finish and, with nobody waiting, the first
        step ending at or after the next arrival); False if there are none."""
        running, config, bs = self.running, self.config, self.config.block_size
        n = len(running)
        if not n or n > config.max_num_batched_tokens or any(s.prefilling for s in running):
            return False
        to_finish = min(s.out - s.generated for s in running)
        spare = sorted(s.held - s.computed for s in running)

        def blocks_within(steps: int) -> int:
            rounds, rest = divmod(steps, bs)
            return n * rounds + bisect_left(spare, rest)

        rounds, i = divmod(self.free // bs, n)
        steps = min(to_finish, spare[i] + rounds * bs)  # the most steps whose blocks are free
        admits = n < config.max_num_batched_tokens and n < config.max_num_seqs and self.free >= bs
        if admits and self.waiting:  # the head fits after the first step's blocks, or in none of these steps
            if self._admission_cost(self.waiting.head()) <= self.free - bs * blocks_within(1):
                return False
        if steps < 1:
            return False
        until = arrival if admits and not self.waiting else float("inf")
        done = self._advance_decodes(steps, until)
        self.events["macro"] += 1
        self.events["steps"] += done
        self.free -= bs * blocks_within(done)
        for s in running:
            s.generated += done
            s.computed += done
            s.held = config.round_up(s.computed)
        if done == to_finish:
            self._retire()
        return True

    def _advance_decodes(self, steps: int, until: float) -> int:
        """SimBackend.decode_run's clock, in its order of float sums."""
        d, e, f = self.model.decode_coef
        n, overhead = len(self.running), self.model.overhead_s
        fixed = d + e * max(0, n - self.model.decode_knee)
        context = sum(s.prompt + s.generated for s in self.running)
        for done in range(1, steps + 1):
            self.now += fixed + f * context + overhead
            if self.now >= until:
                return done
            context += n
        return steps

    # -- memory and ends ----------------------------------------------------------------------------
    def _advance(self, elapsed: float) -> None:
        if self.cold:  # the engine's first step (SimBackend.mixed)
            elapsed, self.cold = elapsed + self.model.cold_start_s, False
        self.now += elapsed

    def _load_cost(self, s: Seq) -> int:
        return 0 if s.adapter is None or s.adapter in self.adapters else self.config.slots_of(s.adapter)

    def _use_adapter(self, s: Seq) -> None:
        if s.adapter is not None:
            self.free -= self._load_cost(s)
            self.adapters[s.adapter] = self.adapters.get(s.adapter, 0) + 1

    def _drop(self, s: Seq) -> None:
        """s stops running: its slots back, its adapter too once nobody running uses it."""
        self.free += s.held
        s.held = s.computed = 0
        if s.adapter is not None:
            self.adapters[s.adapter] -= 1
            if not self.adapters[s.adapter]:
                del self.adapters[s.adapter]
                self.free += self.config.slots_of(s.adapter)

    def _prefilled(self, s: Seq) -> None:
        """s's prefill completed in the step that just ended: it yields a token."""
        s.prefilling = False
        s.generated += 1
        if s.first_token is None:
            s.first_token = self.now

    # -- what the scheduler decides (FCFS here; benchmarks/vtc_rule.py: VTC) ---------------------
    def _order_victims_last(self) -> None:
        self.running.sort(key=Seq.key)  # FCFS's victims (the latest arrivals) last

    def _charge(self, chunks: list[tuple[Seq, int, int]], decodes: list[Seq]) -> None:
        """A step's charges, after its scheduling: FCFS charges nothing."""

    def _finished(self, s: Seq) -> None:
        self._drop(s)
        self.ends[s.rid] = self.now

    def _preempt(self, s: Seq) -> None:
        s.preemptions += 1
        self._drop(s)
        s.prefilling = True  # its next prefill covers its prompt and what it generated
        self.waiting.push(s)

    def _retire(self) -> None:
        if min([s.out - s.generated for s in self.running], default=1) > 0:
            return
        for s in [s for s in self.running if s.generated >= s.out]:
            self._finished(s)
        self.running = [s for s in self.running if s.generated < s.out]
