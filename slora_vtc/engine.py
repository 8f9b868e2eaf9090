"""The continuous-batching loop of S-LoRA's router (docs/design.md, "The engine loop").

Prefill and decode run as separate forward passes. When nothing runs, the scheduler picks a
batch. Otherwise the engine decodes, and every `max_wait_steps` decode steps asks the scheduler
for more; if it admits some, they are prefilled as a mini-batch and merged, otherwise it decodes
and asks again next step. The engine never looks at how a step is computed.

Conservative admission (S-LoRA's, the default) reserves every request's worst case, so nothing is
ever preempted. Under optimistic admission a decode step that cannot get a slot for every running
request first preempts the scheduler's victims by recompute: a victim's K/V are freed and it waits
again with its generated tokens, to be prefilled over prompt and outputs later.

On a simulated backend (virtual time) the decode steps between two events run as one macro-step
with the same results (slora_vtc/macro_step.py; EngineConfig.macro_steps turns it off). `step`
takes it when told when the next outside event comes; `run` does that unless `on_step` watches.

Under `config.batching == "chunked"` every step is vLLM's instead (slora_vtc/chunked.py): a token
budget, running requests first, waiting prompts prefilled in chunks, memory in blocks.
"""

import math
from collections.abc import Callable, Iterable

from slora_vtc.backends.base import ModelBackend, StepResult
from slora_vtc.chunked import ChunkedBatching
from slora_vtc.clock import Clock, VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.errors import UserError
from slora_vtc.macro_step import alike_steps
from slora_vtc.memory import Budget, MemoryManager, fits_alone
from slora_vtc.request import Request, State
from slora_vtc.sched.base import Scheduler
from slora_vtc.step_logger import StepLogger, StepWork
from slora_vtc.steplog import StepLogWriter

EndHook = Callable[[Request], None]
Horizon = Callable[[float], float]  # Engine.step's horizon


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        scheduler: Scheduler,
        backend: ModelBackend,
        clock: Clock,
        memory: MemoryManager,
        on_end: EndHook | None = None,
    ):
        self.config = config
        self.scheduler = scheduler
        self.backend = backend
        self.clock = clock
        self.memory = memory
        self.on_end = on_end
        if config.admission == "optimistic" and not scheduler.traits.preemption:
            raise UserError(
                f"scheduler {type(scheduler).__name__} cannot take preempted requests back: "
                "it needs --admission conservative"
            )
        self.running: list[Request] = []
        self.step_log: StepLogger | None = None  # log_steps: one record per forward pass
        self.chunked = ChunkedBatching(self) if config.chunked else None
        self._macro = config.macro_steps and backend.decodes_ahead and isinstance(clock, VirtualClock)
        self._steps_since_admission = 0
        self._next_rid = 0

    # -- requests in ----------------------------------------------------------------------
    def add_request(self, req: Request) -> bool:
        """Hand a new request to the scheduler; a request that can never fit is rejected."""
        if req.rid < 0:
            req.rid, self._next_rid = self._next_rid, self._next_rid + 1
        if self.step_log is not None:
            self.step_log.took_in()
        if (refusal := self._refusal(req)) is not None:
            self._end(req, State.REJECTED, refusal)
            return False
        if not self.scheduler.on_arrival(req, req.arrival):
            self._end(req, State.REJECTED, "rejected by the scheduler (rate limit)")
            return False
        return True

    def _refusal(self, req: Request) -> str | None:
        """Why the engine rejects a request at arrival, before its scheduler sees it (None: it does not)."""
        if req.adapter is not None and not self.backend.has_adapter(req.adapter):
            return f"unknown LoRA adapter '{req.adapter}'"
        if not fits_alone(req, self.config):
            return "request can never fit the memory pool"
        return None

    def abort(self, req: Request, reason: str = "aborted", keep_cache: bool = True) -> None:
        """End a waiting or running request now and free its slots (its K/V stay cached unless
        `keep_cache` is False)."""
        if req in self.running:
            self.running.remove(req)
            self._release(req, keep_cache)
            self.scheduler.on_abort(req, self.clock.now())
        elif not self.scheduler.remove(req):
            return
        else:
            self._forget_waiting(req)
        self._end(req, State.ABORTED, reason)
        self.memory.evict_unused(self.running)

    def finish(self, req: Request) -> None:
        """End a request now as finished, as if it had generated a stop token (the serving path
        found a stop string in its text); no-op once it has ended."""
        if req in self.running:
            req.stopped = True
            self._retire([req])
        elif self.scheduler.remove(req):  # preempted and waiting again: it keeps what it generated
            self._forget_waiting(req)
            req.stopped = True
            self._end(req, State.FINISHED)

    @property
    def busy(self) -> bool:
        return bool(self.running) or self.scheduler.num_waiting() > 0

    def log_steps(self, path: str) -> None:
        """Write one step record per forward pass to `path` (slora_vtc/steplog.py); single steps only."""
        self.step_log = StepLogger(StepLogWriter(path).open(), self.memory, self.backend.simulated)

    # -- the loop -------------------------------------------------------------------------
    def step(self, until: float | None = None, horizon: Horizon | None = None) -> bool:
        """One forward pass; returns False when there was nothing the engine could run.

        `until`: when the next thing outside the engine happens (an arrival, the end of the run).
        Given it, a simulated decode may run as a macro-step, up to the first step ending at or
        after `until`, or earlier where single steps would stop being alike. `horizon`: given the
        end of a macro-step, the first event before it that the macro-step must stop at; arrivals
        before that one queue behind and are added after it (`arrival_horizon`).
        """
        if self.chunked is not None:
            return self.chunked.step(until, horizon)
        ahead = until is not None and self._macro and bool(self.running) and self.step_log is None
        if ahead and (steps := self._alike_steps(attempt_now=True)):
            self._decode_ahead(steps, until, horizon)  # the attempt due now, if any, provably admits nothing
            return True
        new = self._admit()
        if new:
            self._prefill(new)
            return True
        if self.running:  # a decode may finish the last running request: it still was a step
            steps = self._alike_steps(attempt_now=False) if ahead else 0
            if steps:
                self._decode_ahead(steps, until, horizon)
            else:
                self._decode()
            return True
        return False

    def run(
        self, requests: Iterable[Request], on_step: Callable[[], None] | None = None, until: float | None = None
    ) -> list[Request]:
        """Serve requests arriving at their `arrival` times until every one has ended.

        `on_step`, if given, is called after every forward pass (to observe the engine mid-run).
        `until`: stop at this time instead; what has not finished by then is aborted.
        """
        pending = sorted(requests, key=lambda r: r.arrival)
        nxt, end = 0, float("inf") if until is None else until
        while nxt < len(pending) or self.busy:
            if until is not None and self.clock.now() >= until:
                self.stop(f"the run ended at {until:g} s", pending[nxt:])
                break
            while nxt < len(pending) and pending[nxt].arrival <= self.clock.now():
                self.add_request(pending[nxt])
                nxt += 1
            next_event = None if on_step else min(end, pending[nxt].arrival) if nxt < len(pending) else end
            horizon = None if on_step else self.arrival_horizon(pending, nxt, end)
            if self.step(next_event, horizon):
                if on_step:
                    on_step()
            elif nxt < len(pending):
                self.clock.wait_until(pending[nxt].arrival)
            elif self.busy:
                raise RuntimeError("scheduler keeps requests waiting while the engine is idle")
        return pending

    def arrival_horizon(self, pending: list[Request], nxt: int, end: float) -> Horizon | None:
        """Engine.step's `horizon` (None where no macro-step reads one: not a simulated backend on a
        virtual clock): of the requests arriving by `last` (pending[nxt:], this engine's, in
        arrival order), the first that does not queue behind, or `end`. One that queues behind
        (the scheduler's queues_behind, and the engine would not reject it) changes nothing that a
        macro-step reads (it admits and preempts nothing): adding it after the macro-step ends it
        as single steps would."""
        if not self._macro:
            return None

        def first_event(last: float) -> float:
            i = nxt
            while i < len(pending) and pending[i].arrival <= last:
                if not self._queues_behind(pending[i]):
                    return min(pending[i].arrival, end)
                i += 1
            return end

        return first_event

    def _queues_behind(self, req: Request) -> bool:
        scheduler = self.scheduler
        return scheduler.traits.lookahead and scheduler.queues_behind(req) and self._refusal(req) is None

    def stop(self, reason: str, not_arrived: Iterable[Request] = ()) -> None:
        """Abort every running, waiting and not yet arrived request."""
        for req in list(self.running):
            self.abort(req, reason)
        for req in [*self.scheduler.drain(), *not_arrived]:
            self.memory.forget(req)
            self._end(req, State.ABORTED, reason)

    def _admit(self) -> list[Request]:
        if self.running and self._steps_since_admission < self.config.max_wait_steps:
            return []
        if self.scheduler.num_waiting() == 0:
            return []
        return self.scheduler.select(Budget(self.config, self.running, self.memory), self.clock.now())

    def _prefill(self, batch: list[Request]) -> None:
        self.memory.admit(batch)
        now = self.clock.now()
        for req in batch:
            req.state = State.RUNNING
            if req.first_admitted is None:
                req.first_admitted = now
        self.running.extend(batch)
        result = self.backend.prefill(batch)
        if self.step_log is not None:
            extend = [r.prefill_len - r.cached_len for r in batch]
            work = StepWork(sum(extend), sum(e * r.cached_len for e, r in zip(extend, batch)), len(batch),
                            sum(r.cached_len for r in batch))  # fmt: skip
            self.step_log.step(now, result.elapsed, work)
        self._apply(batch, result)
        self.memory.cache_prefill(r for r in batch if r.state is State.RUNNING)
        self._steps_since_admission = 0
        self._retire(batch)

    def _decode(self) -> None:
        # conservative admission guarantees the slots (PoolExhausted otherwise: a bug, never hidden)
        preempted = 0
        while self.config.admission == "optimistic" and self.memory.available < len(self.running):
            self._preempt(self.scheduler.choose_victim(self.running, self.clock.now()))
            preempted += 1
        if not self.running:
            return
        self.scheduler.on_decode_step(self.running, self.clock.now())
        self.memory.extend(self.running)
        start = self.clock.now()  # a wall clock moves during the pass, a virtual one in _apply
        result = self.backend.decode(self.running)
        if self.step_log is not None:
            context = sum(r.prompt_len + r.generated for r in self.running)
            work = StepWork(decode_reqs=len(self.running), context_tokens=context, preempted=preempted)
            self.step_log.step(start, result.elapsed, work)
        self._apply(self.running, result)
        self._steps_since_admission += 1
        self._retire(self.running)

    def _alike_steps(self, attempt_now: bool) -> int:
        """Decode steps from now that single steps would run alike; attempt_now: the admission
        attempt due now (if one is) has not been made and must provably admit nothing too."""
        first = max(0 if attempt_now else 1, self.config.max_wait_steps - self._steps_since_admission)
        return alike_steps(self.running, self.scheduler, self.memory, self.config, first)

    def _decode_ahead(self, steps: int, until: float, horizon: Horizon | None) -> None:
        steps, end = self.decode_run(steps, until, horizon)
        self.memory.extend(self.running, steps)
        self._charge_and_grow(steps)
        self.clock.wait_until(end)  # virtual time: now = end, summed step by step by the backend
        self._steps_since_admission += steps
        self._retire(self.running)

    def decode_run(self, steps: int, until: float, horizon: Horizon | None) -> tuple[int, float]:
        """The backend's decode_run of the running requests up to `until` (steps run, end time);
        where that cuts the steps short and `horizon` lets them run past `until`, up to what it
        names instead (Engine.step)."""
        run, now = self.backend.decode_run, self.clock.now()
        if horizon is None or horizon(until) <= until:  # the arrival at `until` does not queue behind
            return run(self.running, steps, now, until)
        done, end = run(self.running, steps, now, math.inf)  # the time they all take
        return (done, end) if end < until else run(self.running, steps, now, max(until, horizon(end)))

    def _charge_and_grow(self, steps: int) -> None:
        """Each running request `steps` tokens longer (what append_token does for the tokens a
        simulator does not produce), charged before each as single steps charge."""
        sched = self.scheduler
        if sched.traits.lookahead and sched.charge_steps(self.running, steps, self.clock.now()):
            for req in self.running:
                req.generated += steps
            return
        for _ in range(steps):
            self.scheduler.on_decode_step(self.running, self.clock.now())
            for req in self.running:
                req.generated += 1

    def _apply(self, batch: list[Request], result: StepResult) -> None:
        self.clock.advance(result.elapsed)
        now = self.clock.now()
        failed = {batch[i].rid for i in result.failed}
        for req, token in zip(batch, result.tokens):
            if req.rid not in failed:
                req.append_token(token, now)
        for req in [r for r in batch if r.rid in failed]:
            self.abort(req, "the model failed on this request", keep_cache=False)

    def _retire(self, batch: list[Request]) -> None:
        finished = [r for r in batch if r.done]
        if not finished:
            return
        self.scheduler.on_finish(finished, batch, self.clock.now())
        self.running = [r for r in self.running if not r.done]
        for req in finished:
            self._release(req)
            self._end(req, State.FINISHED)
        self.memory.evict_unused(self.running)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.memory.release(req)
        self.backend.release(req, preempted=True)
        req.state = State.WAITING
        req.preemptions += 1
        self.scheduler.on_preempt(req, self.clock.now())
        self.memory.evict_unused(self.running)

    def _forget_waiting(self, req: Request) -> None:
        """A waiting request leaves for good: what memory and backend kept for it since a preemption goes too."""
        self.memory.forget(req)
        self.backend.release(req)

    def _release(self, req: Request, keep_cache: bool = True) -> None:
        self.memory.release(req, keep_cache)
        self.backend.release(req)

    def _end(self, req: Request, state: State, reason: str = "") -> None:
        req.state, req.reason = state, reason
        req.finish_time = self.clock.now()
        if self.chunked is not None:
            self.chunked.forget(req)
        if self.on_end:
            self.on_end(req)
