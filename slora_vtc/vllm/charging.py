"""What a vLLM step computed and produced, reported to our scheduler as our engine reports it.

Our engine charges a request's prompt when it is admitted (`on_prefill`; its first token comes
with the prefill, free) and each later token before the decode step that makes it
(`on_decode_step`). In vLLM:

- Prompts, after each schedule(): the prompt tokens a step computes (a chunk under chunked prefill)
  are charged at once. Each chunk reports the whole prefill so far, `on_prefill(computed so far,
  cached)`, and what the report before it charged is refunded (`Ledger.adjust`), so that the
  charges add up to one report of the whole prompt whatever the cost function. `cached` is the
  prefix-cache hit at its first admission (VTC charges it `charge_cached` each).
- Tokens, in update_from_output: each token vLLM delivered is charged as it is produced (one step
  after it was scheduled, under async scheduling), except the first after a prefill, which that
  prefill paid for. Tokens scheduled but never delivered (the step after a stop string) are not
  charged, so that the counters add up to what vLLM reports in `usage`.
- A preempted request, when vLLM admits it again, is reported with `on_prefill` once more (VTC
  charges then the token its second prefill yields; recomputed K/V only with charge_recompute).
- Ends: `on_finish` when vLLM finishes a running request, `on_abort` when it aborts one; a waiting
  request leaves through the queue's `remove` (queue.py).
"""

from collections.abc import Callable

from slora_vtc.sched import Scheduler
from slora_vtc.vllm.stats import TenantStats
from slora_vtc.vllm.tracked import Requests, Tracked, Where


class Charging:
    def __init__(self, scheduler: Scheduler, requests: Requests, stats: TenantStats, now: Callable[[], float]):
        self.scheduler, self.requests, self.stats, self.now = scheduler, requests, stats, now
        self.refunds = scheduler.traits.ledger

    # -- after schedule(): prompts ----------------------------------------------------------------
    def after_schedule(self, num_scheduled_tokens: dict[str, int]) -> None:
        now = None
        for req_id, n in num_scheduled_tokens.items():
            t = self.requests.get(req_id)
            if t is None:
                continue
            vreq = t.vreq
            if t.admitting:
                now = now or self.now()
                self._admitted(t, vreq.num_computed_tokens - n, now)
            elif t.cached is not None and t.prompt_done < vreq.num_prompt_tokens and not vreq.num_output_tokens:
                now = now or self.now()
                self._prompt_progress(t, vreq.num_computed_tokens, now)

    def _admitted(self, t: Tracked, start: int, now: float) -> None:
        """vLLM admitted it this step, its prefill starting at `start` (the prefix-cache hit)."""
        t.admitting, t.free_token = False, True
        vreq = t.vreq
        if vreq.num_output_tokens:  # back from a preemption, with tokens
            t.mirror.generated = vreq.num_output_tokens
            charged = self.scheduler.on_prefill(t.mirror, vreq.num_tokens - start, start, now)
            self.stats.charge(t.tenant, charged)
            return
        if t.cached is None:
            t.cached = min(start, vreq.num_prompt_tokens)
            self.stats.cached(t.tenant, t.cached)
        self._prompt_progress(t, vreq.num_computed_tokens, now)

    def _prompt_progress(self, t: Tracked, computed_to: int, now: float) -> None:
        done = min(computed_to, t.vreq.num_prompt_tokens)
        if t.prompt_charge is not None and done <= t.prompt_done:
            return
        previous, before = t.prompt_charge, max(t.prompt_done, t.cached)
        t.prompt_done = done
        t.mirror.generated = 0
        charged = self.scheduler.on_prefill(t.mirror, done - t.cached, t.cached, now)
        if previous is not None and self.refunds:
            self.scheduler.adjust(t.tenant, -previous)
            charged -= previous
        t.prompt_charge = charged + (previous or 0.0)
        self.stats.charge(t.tenant, charged)
        self.stats.computed(t.tenant, done - before)

    # -- update_from_output: tokens and ends -----------------------------------------------------
    def before_update(self, num_scheduled_tokens: dict[str, int]) -> list[tuple[Tracked, int]]:
        """The requests of the step whose output comes in, with their tokens so far."""
        seen = []
        for req_id in num_scheduled_tokens:
            t = self.requests.get(req_id)
            if t is not None:
                seen.append((t, t.vreq.num_output_tokens))
        return seen

    def after_update(self, seen: list[tuple[Tracked, int]]) -> None:
        now = self.now()
        for t, before in seen:
            vreq = t.vreq
            after = vreq.num_output_tokens
            for n in range(before, after):
                if t.free_token:
                    t.free_token = False
                    continue
                t.mirror.generated = n
                self.stats.charge(t.tenant, self.scheduler.on_decode_step([t.mirror], now))
            self.stats.produced(t.tenant, after - before)
            t.mirror.generated = after
            if vreq.is_finished():
                self.finished(t, now)

    def finished(self, t: Tracked, now: float) -> None:
        if t.where is Where.RUNNING:
            self.scheduler.on_finish([t.mirror], [t.mirror], now)
        self.stats.ended(t.tenant, "finished")
        self.requests.drop(t)

    def aborted(self, t: Tracked, now: float) -> None:
        if t.where is Where.RUNNING:
            self.scheduler.on_abort(t.mirror, now)
        self.stats.ended(t.tenant, "aborted")
        self.requests.drop(t)
