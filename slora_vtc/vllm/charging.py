"""What a vLLM step computed and produced, reported to our scheduler as our engine reports it.

Our engine charges a request's prompt when it is admitted (`on_prefill`; its first token comes
with the prefill, free) and each later token before the decode step that makes it
(`on_decode_step`). In vLLM:

- Prompts, after each schedule(): the prompt tokens a step computes (a chunk under chunked prefill)
  are charged at once, as our engine's chunked batching charges them (sched/prompt_charge.py): each
  chunk reports the whole prefill so far and the report before it is refunded. `cached` is the
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
from slora_vtc.sched.prompt_charge import PromptProgress
from slora_vtc.vllm.stats import TenantStats
from slora_vtc.vllm.tracked import Requests, Tracked, Where


class Charging:
    def __init__(self, scheduler: Scheduler, requests: Requests, stats: TenantStats, now: Callable[[], float]):
        self.scheduler, self.requests, self.stats, self.now = scheduler, requests, stats, now

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
            elif t.prompt is not None and t.prompt.done < vreq.num_prompt_tokens and not vreq.num_output_tokens:
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
        if t.prompt is None:
            t.prompt = PromptProgress(cached=min(start, vreq.num_prompt_tokens))
            self.stats.cached(t.tenant, t.prompt.cached)
        self._prompt_progress(t, vreq.num_computed_tokens, now)

    def _prompt_progress(self, t: Tracked, computed_to: int, now: float) -> None:
        progress = t.prompt
        before = max(progress.done, progress.cached)
        t.mirror.generated = 0
        charged = progress.report(self.scheduler, t.mirror, computed_to, now)
        if progress.done > before or charged:
            self.stats.charge(t.tenant, charged)
            self.stats.computed(t.tenant, progress.done - before)

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
        """Charge the tokens the step delivered: a tenant's requests that each got one token in one
        `on_decode_step` (the usual step), any other token on its own."""
        now = self.now()
        delivered = [(t, before, t.vreq.num_output_tokens) for t, before in seen]
        one_token: dict[str, list] = {}
        for t, before, after in delivered:
            if after == before + 1 and not t.free_token:
                t.mirror.generated = before
                one_token.setdefault(t.tenant, []).append(t.mirror)
            else:
                self._charge_each(t, before, after, now)
        for tenant, mirrors in one_token.items():
            self.stats.charge(tenant, self.scheduler.on_decode_step(mirrors, now))
        for t, before, after in delivered:
            self.stats.produced(t.tenant, after - before)
            t.mirror.generated = after
            if t.vreq.is_finished():
                self.finished(t, now)

    def _charge_each(self, t: Tracked, before: int, after: int, now: float) -> None:
        for n in range(before, after):
            if t.free_token:  # the first token after a prefill: the prefill paid for it
                t.free_token = False
                continue
            t.mirror.generated = n
            self.stats.charge(t.tenant, self.scheduler.on_decode_step([t.mirror], now))

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
