"""Chunked batching: vLLM v1's step rule in our engine (`--batching chunked`; docs/design.md,
"Chunked batching"). The Engine delegates its step here when `config.batching == "chunked"`.

Each step has a token budget (`max_num_batched_tokens`). Running requests come first, in the order
of the running list: a decode takes one token, a request still in its prefill its next chunk, as
much of the rest of its prefill as the budget leaves. Then, unless this step preempted, waiting
requests in the scheduler's order (peek, pop), each taking what is left of the budget, while fewer
than `max_num_seqs` run and the free blocks would hold its whole prefill, not only its first chunk
(vLLM's default, `scheduler_reserve_full_isl`); they join the list's end. Memory is allocated in
blocks of `block_size` tokens for the tokens a step computes. When a running request cannot get its
blocks, the last request of the list is preempted by recompute, again until the request fits or is
itself the victim, which ends the running pass (vLLM's rule). Before a step that may preempt, the
list is ordered victims last by the scheduler's `victim_order`, as our vLLM plugin orders vLLM's
(sched/victims.py): victims then always come after the request they make room for. A waiting
request that cannot get its blocks ends the waiting pass (head-of-line, as vLLM). With the prefix
cache, hits count in whole blocks. tests/vllm/test_step_rule.py holds this against vLLM's scheduler.

Charges, as the vLLM plugin charges inside vLLM (sched/prompt_charge.py): after scheduling, each
prompt chunk reports the prefill so far and the report before it is refunded; a request back from a
preemption with tokens is reported once, at its admission; decodes are charged before the step, the
token a completed prefill yields is free.

On a simulated backend, pure decode steps that single steps would run alike (nothing in prefill,
nothing waiting that the step rule could admit, no block short) run as one macro-step, with the
same results (chunked_macro.py). Single steps take short paths where the rule's result is known
another way: a decoding request's positions follow from its counts (`decoded_to`), a running pass of
decodes only visits the requests whose last block is full, and a simulator's step only counts tokens.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slora_vtc.backends.base import Chunk, StepResult
from slora_vtc.chunked_macro import alike_steps, decode_ahead, decoded_to, slots_to_grow
from slora_vtc.clock import VirtualClock
from slora_vtc.errors import UserError
from slora_vtc.memory.budget import CacheHits
from slora_vtc.request import Request, State
from slora_vtc.sched.prompt_charge import CannotRefund, PromptProgress
from slora_vtc.sched.victims import may_preempt, victims_last
from slora_vtc.step_logger import StepWork

if TYPE_CHECKING:
    from slora_vtc.engine import Engine, Horizon


@dataclass
class Plan:
    """One step: the prefill chunks (running requests' first, then newly scheduled ones) and decodes."""

    chunks: list[Chunk] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    started: list[Request] = field(default_factory=list)  # scheduled this step from the waiting queue
    preempted: int = 0

    def __bool__(self) -> bool:
        return bool(self.chunks or self.decodes)


class ChunkedBatching:
    """The step rule for one engine. A running request whose prefill is complete has computed the
    K/V of every position but its newest token's (`decoded_to`); it keeps the positions of the others."""

    def __init__(self, engine: "Engine"):
        if not engine.scheduler.traits.preemption:
            raise UserError(
                f"scheduler {type(engine.scheduler).__name__} cannot take preempted requests back: "
                "--batching chunked preempts by recompute"
            )
        if not engine.backend.mixes:
            raise UserError(
                f"backend {type(engine.backend).__name__} cannot run --batching chunked: "
                "it does not compute prefill chunks and decodes in one step"
            )
        self.engine, self.config = engine, engine.config
        self.prefilling: dict[int, int] = {}  # rid -> positions whose K/V exist (cached ones included), of
        # running requests whose prefill is not complete
        self.prompts: dict[int, PromptProgress] = {}  # rid -> its prompt's charges, until it ends
        self.computed_to: dict[int, int] = {}  # rid -> positions whose K/V a preempted request had
        # computed before (the most over its preemptions), until it ends: what its chunks compute again
        self._event_next = False  # a macro-step ended where the next step is a single one: no need to ask
        # on a virtual clock nothing frees a block between steps (no abort comes in from outside), so an
        # order no step reads before the next one that may preempt need not be made (_schedule_running)
        self._lazy_order = isinstance(engine.clock, VirtualClock)
        # behind a queue other engines pull from (a cluster replica under global VTC), each call would
        # have to end at a step that admits or preempts, and at any other replica's next step: macro-steps
        # then cost more than the single steps they stand for (benchmarks/README.md: the macro-step check)
        self._macro = (
            self.config.macro_steps
            and engine.backend.decodes_ahead
            and isinstance(engine.clock, VirtualClock)
            and not engine.scheduler.traits.shared_queue
        )

    # -- the engine's calls -----------------------------------------------------------------------
    def step(self, until: float | None, horizon: "Horizon | None" = None) -> bool:
        """Given `until` on a simulated backend, the steps up to it, single and macro alike, in one
        call: nothing from outside the engine changes anything before `until` (Engine.step). A
        macro-step runs on past `until` to what `horizon` says it must stop at."""
        if until is None or not self._macro or self.engine.step_log is not None:
            return self._single_step()
        clock, stepped = self.engine.clock, False
        while not stepped or clock.now() < until:  # at least one, as a single call would
            if self._event_next or not (alike := alike_steps(self)).steps:
                if not self._single_step():
                    break
            else:
                self._event_next = decode_ahead(self, alike, until, horizon)
            stepped = True
        return stepped

    def _single_step(self) -> bool:
        self._event_next = False
        plan = self._schedule()
        if not plan:  # nothing to compute; a step that only preempted still changed something
            return plan.preempted > 0
        self._charge(plan)
        self._count_recomputed(plan)
        self._run(plan)
        return True

    def forget(self, req: Request) -> None:
        """A request ended."""
        self.prefilling.pop(req.rid, None)
        self.prompts.pop(req.rid, None)
        self.computed_to.pop(req.rid, None)

    # -- scheduling: vLLM's step rule ---------------------------------------------------------------
    def _schedule(self) -> Plan:
        plan, budget = Plan(), self.config.max_num_batched_tokens
        budget = self._schedule_running(plan, budget)
        if not plan.preempted:
            self._schedule_waiting(plan, budget)
        return plan

    def _schedule_running(self, plan: Plan, budget: int) -> int:
        """The running pass: each running request in order its decode or next chunk, preempting for
        the blocks it needs; returns the budget it leaves. Where the step may preempt, the running
        list is first ordered victims last (sched/victims.py)."""
        eng, block = self.engine, self.config.block_size
        ordered = self.may_preempt(eng.memory.available // block)
        if self.prefilling or len(eng.running) > budget:
            if ordered:
                self.order_victims_last()
            return self._schedule_one_by_one(plan, budget)
        short = self._short_of_a_block()
        if ordered and (not self._lazy_order or len(short) * block > eng.memory.available or self._finishing()):
            self.order_victims_last()  # else this step reads no order, and the next may preempt too: it orders
            short = self._short_of_a_block()
        return self._schedule_decodes(plan, budget, short)

    def _short_of_a_block(self) -> list[Request]:
        """The running requests (all decoding) whose last block is full, in order."""
        block = self.config.block_size
        return [r for r in self.engine.running if not (r.prompt_len + r.generated - 1 - r.cached_len) % block]

    def _finishing(self) -> bool:
        """Whether a decoding request makes its last token in this step (its blocks are then freed)."""
        return min([r.max_new_tokens - r.generated for r in self.engine.running]) <= 1

    def may_preempt(self, free_blocks: int) -> bool:
        """Whether a step that starts with `free_blocks` may preempt one of several running requests."""
        running, config = len(self.engine.running), self.config
        return running > 1 and may_preempt(free_blocks, config.max_num_batched_tokens, config.block_size, running)

    def order_victims_last(self) -> None:
        eng = self.engine
        order = victims_last(eng.running, eng.scheduler, eng.clock.now())
        if order != eng.running:  # requests compare by identity; an unchanged list keeps what was kept for it
            eng.running[:] = order

    def _schedule_one_by_one(self, plan: Plan, budget: int) -> int:
        eng, memory = self.engine, self.engine.memory
        prefilling, block = self.prefilling, self.config.block_size
        running, ids = eng.running, memory.pool.hands_out_ids
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            done = prefilling.get(req.rid)
            if done is None:  # a decode: one token, a new block when its last one is full
                n, slots = 1, 0 if (req.prompt_len + req.generated - 1 - req.cached_len) % block else block
                if not slots:
                    if ids:
                        memory.grow(req, 1, 0)
                    plan.decodes.append(req)
                    budget -= 1
                    i += 1
                    continue
            else:
                n = min(req.prefill_len - done, budget)
                slots = self._slots(req, done, n)
            if slots > memory.available and not self._preempt_for(req, slots, plan):
                break
            memory.grow(req, n, slots)
            if done is None:
                plan.decodes.append(req)
            else:
                prefilling[req.rid] = done + n
                plan.chunks.append(Chunk(req, done, n))
                memory.cache_scheduled(req, done + n)
            budget -= n
            i += 1
        return budget

    def _preempt_for(self, req: Request, slots: int, plan: Plan) -> bool:
        """Preempt the last running request (the scheduler's victim, the list ordered victims last)
        until `req` can get `slots`, or is itself the victim, which ends the running pass: False then.
        Victims come after `req` in the list, so none of them was scheduled this step."""
        eng, running = self.engine, self.engine.running
        while slots > eng.memory.available:
            victim = running[-1]
            self._preempt(victim)
            plan.preempted += 1
            if victim is req:
                return False
        return True

    def _schedule_decodes(self, plan: Plan, budget: int, short: list[Request]) -> int:
        """_schedule_one_by_one where every running request decodes and the budget covers them all:
        only a request whose last block is full (`short`) needs a step of its own (it may preempt from
        the end of the list; when it is itself the victim, it was the last one), and on a pool with
        slot ids every other decode then writes into a slot it holds."""
        eng, memory, block = self.engine, self.engine.memory, self.config.block_size
        running, grown = eng.running, set()
        for req in short:
            if req.state is not State.RUNNING:  # preempted for one before it
                continue
            if block > memory.available and not self._preempt_for(req, block, plan):
                break
            memory.grow(req, 1, block)
            grown.add(req.rid)
        plan.decodes = list(running)
        if memory.pool.hands_out_ids:  # the others write their token into a slot they hold
            rest = [r for r in plan.decodes if r.rid not in grown]
            memory.grow_all(rest, 1, [0] * len(rest))
        return budget - len(plan.decodes)

    def _schedule_waiting(self, plan: Plan, budget: int) -> None:
        eng, memory, config = self.engine, self.engine.memory, self.config
        view = CacheHits(memory)
        # a new request needs at least one block: with none available nobody is asked (a macro-step
        # skips exactly these steps, so a scheduler whose peek has effects sees the same calls)
        while budget > 0 and len(eng.running) < config.max_num_seqs and memory.available >= config.block_size:
            if not eng.scheduler.num_waiting():
                break
            req = eng.scheduler.peek(view)
            if req is None:
                break
            cached = memory.cached_len(req)
            n = min(req.prefill_len - cached, budget)
            slots = config.round_up(n)
            if config.round_up(req.prefill_len - cached) + memory.start_cost(req) > memory.available:
                break  # its whole prefill must fit, not only this chunk (vLLM's scheduler_reserve_full_isl)
            now = eng.clock.now()
            eng.scheduler.pop(req, now)
            memory.start(req)
            memory.grow(req, n, slots)
            memory.cache_scheduled(req, req.cached_len + n)
            req.state = State.RUNNING
            if req.first_admitted is None:
                req.first_admitted = now
            eng.running.append(req)
            self.prefilling[req.rid] = req.cached_len + n
            plan.chunks.append(Chunk(req, req.cached_len, n))
            plan.started.append(req)
            budget -= n

    def _slots(self, req: Request, done: int, n: int) -> int:
        """Slots the request's next n tokens take beyond what it holds (its own tokens, in blocks)."""
        block = self.config.block_size
        return slots_to_grow([(req.cached_len - done) % block], n, block)[0]

    def _preempt(self, req: Request) -> None:
        done = self.prefilling.pop(req.rid, None)
        computed = decoded_to(req) if done is None else done  # mid-prompt: the chunks so far
        self.computed_to[req.rid] = max(self.computed_to.get(req.rid, 0), computed)
        self.engine._preempt(req)

    def _count_recomputed(self, plan: Plan) -> None:
        """Request.recomputed: the positions of each chunk that a preemption had already seen computed."""
        for chunk in plan.chunks:
            if (computed := self.computed_to.get(chunk.req.rid)) is not None:
                chunk.req.recomputed += max(0, min(chunk.start + chunk.length, computed) - chunk.start)

    # -- charging ----------------------------------------------------------------------------------
    def _charge(self, plan: Plan) -> None:
        sched, now = self.engine.scheduler, self.engine.clock.now()
        started = {id(r) for r in plan.started} if plan.started else ()
        for chunk in plan.chunks:
            req = chunk.req
            if req.generated:  # back from a preemption with tokens: reported once, at its admission
                if id(req) in started:
                    sched.on_prefill(req, req.prefill_len - req.cached_len, req.cached_len, now)
                continue
            progress = self.prompts.get(req.rid)
            if progress is None:
                progress = self.prompts[req.rid] = PromptProgress(req.cached_len)
            try:
                progress.report(sched, req, chunk.start + chunk.length, now)
            except CannotRefund as e:
                raise UserError(
                    f"scheduler {e} charges prompts but keeps no ledger to refund a chunk's report: "
                    "it cannot run with --batching chunked"
                ) from None
        if plan.decodes and not (sched.traits.lookahead and sched.charge_steps(plan.decodes, 1, now)):
            sched.on_decode_step(plan.decodes, now)

    # -- running the step --------------------------------------------------------------------------
    def _run(self, plan: Plan) -> None:
        eng = self.engine
        start = eng.clock.now()
        result = eng.backend.mixed(plan.chunks, plan.decodes)
        eng.clock.advance(result.elapsed)
        if result.failed or result.tokens.count(None) != len(result.tokens):
            completed, failed = self._append_tokens(plan, result)
            finishing = True
        else:  # a simulator's step: no token ids, nothing failed
            completed, finishing = self._count_tokens(plan)
            failed = []
        if eng.step_log is not None:
            self._log(plan, start, result.elapsed)
        for req in failed:
            eng.abort(req, "the model failed on this request", keep_cache=False)
        if completed:
            eng.memory.cache_prefill(r for r in completed if r.state is State.RUNNING)
        if finishing:
            eng._retire(self._scheduled_in_order(plan))

    def _scheduled_in_order(self, plan: Plan) -> list[Request]:
        """The step's requests still running, in the order vLLM schedules them (its running list's,
        then those it started), which is the order in which it frees those that finished: a prefix
        cache evicts the blocks freed first first. Ours is the running list's too (started requests
        joined its end; failed ones left it)."""
        scheduled = {id(c.req) for c in plan.chunks}.union(map(id, plan.decodes))
        return [r for r in self.engine.running if id(r) in scheduled]

    def _append_tokens(self, plan: Plan, result: StepResult) -> tuple[list[Request], list[Request]]:
        """The step's tokens: a completed prefill's first, one per decode. Returns the requests whose
        prefill completed and those the model failed on."""
        now = self.engine.clock.now()
        batch = [c.req for c in plan.chunks] + plan.decodes
        failed = {batch[i].rid for i in result.failed}
        completed = []
        for i, (req, token) in enumerate(zip(batch, result.tokens)):
            if req.rid in failed:
                continue
            if i < len(plan.chunks):
                if not plan.chunks[i].completes:
                    continue
                del self.prefilling[req.rid]
                completed.append(req)
            req.append_token(token, now)
        return completed, [r for r in batch if r.rid in failed]

    def _count_tokens(self, plan: Plan) -> tuple[list[Request], bool]:
        """_append_tokens for a step without token ids or failures: counts only (a decoding
        request's first token came with its prefill). Returns the requests whose prefill completed,
        and whether any request made its last token."""
        now, completed, finishing = self.engine.clock.now(), [], False
        for chunk in plan.chunks:
            if chunk.completes:
                req = chunk.req
                del self.prefilling[req.rid]
                completed.append(req)
                req.append_token(None, now)
                finishing = finishing or req.generated >= req.max_new_tokens
        for req in plan.decodes:
            req.generated += 1
        return completed, finishing or min([r.max_new_tokens - r.generated for r in plan.decodes], default=1) <= 0

    def _log(self, plan: Plan, start: float, elapsed: float) -> None:
        work = StepWork(
            prefill_tokens=sum(c.length for c in plan.chunks),
            prefill_pairs=sum(c.length * c.start for c in plan.chunks),
            prefill_reqs=len(plan.chunks),
            cached_tokens=sum(r.cached_len for r in plan.started),
            decode_reqs=len(plan.decodes),
            context_tokens=sum(r.prompt_len + r.generated - 1 for r in plan.decodes),
            preempted=plan.preempted,
        )
        self.engine.step_log.step(start, elapsed, work)
