"""FairScheduler: vLLM's scheduler with our schedulers ordering its waiting queues, charging what
each step computes and produces, and choosing its preemption victims (docs/vllm.md).

The policy is written once (`FairPolicy`) and combined with vLLM's two schedulers: `AsyncScheduler`
(vLLM's default, async scheduling) and the plain `Scheduler` (`--no-async-scheduling`).
`FairScheduler`, the name `--scheduler-cls` takes, builds the one that matches vLLM's setting.
Everything vLLM does stays vLLM's: the plugin only replaces the two waiting queues, orders the
running list before a step where a preemption could happen, and reads what steps did.
"""

import time

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

from slora_vtc.errors import UserError
from slora_vtc.vllm.charging import Charging
from slora_vtc.vllm.config import PluginConfig
from slora_vtc.vllm.queue import CachedLen, FairQueue, HoldingQueue
from slora_vtc.vllm.stats import TenantStats
from slora_vtc.vllm.steps import StepLog
from slora_vtc.vllm.tracked import Requests, Tracked, Where
from slora_vtc.vllm.victims import may_preempt, victims_last

logger = init_logger("vllm.slora_vtc")


class FairPolicy:
    """The plugin, as a mixin in front of one of vLLM's schedulers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        try:
            config = PluginConfig.of(self.vllm_config.additional_config)
            self.fair = config.build_scheduler(config.load_clients())
            if self.policy is not SchedulingPolicy.FCFS:
                raise UserError("--scheduling-policy must be fcfs (the plugin's scheduler decides the order)")
            self.step_log = StepLog(config.step_log) if config.step_log else None
        except UserError as e:
            logger.error("slora_vtc: %s", e)
            raise SystemExit(f"slora_vtc: {e}") from None
        self.clock = time.monotonic
        self.tracked = Requests()
        self.tenant_stats = TenantStats(config.scheduler, config.log_interval_s, config.stats_file)
        self.charging = Charging(self.fair, self.tracked, self.tenant_stats, self.clock)
        self.rejected: list[Tracked] = []
        self._running_counters: dict[str, float] = {}  # of the tenants running when a step that may preempt began
        self.waiting = FairQueue(self.fair, self.tracked, self.clock, self.rejected.append)
        self.kv_holding_waiting = HoldingQueue(self.fair, self.tracked, self.clock, self.rejected.append)
        logger.info("slora_vtc: scheduler %s orders vLLM's waiting queues (%s)", config.scheduler, type(self).__name__)

    # -- arrivals --------------------------------------------------------------------------------------
    def add_request(self, request) -> None:
        if self.step_log:
            self.step_log.took_in()
        super().add_request(request)
        if self.rejected and self.rejected[-1].vreq is request:
            super().finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
            logger.info("slora_vtc: rejected request %s of tenant %s (rate limit)", request.request_id,
                        self.rejected[-1].tenant)  # fmt: skip
            self.tenant_stats.ended(self.rejected[-1].tenant, "rejected")
            self.tracked.drop(self.rejected[-1])

    # -- a step ----------------------------------------------------------------------------------------
    def schedule(self, *args, **kwargs):
        start = time.perf_counter()
        self._order_running()
        self.waiting.new_step(CachedLen(self.kv_cache_manager, self.tracked))
        before = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        after = time.perf_counter()
        if output.preempted_req_ids:
            self._note_victims(output.preempted_req_ids)
        self.charging.after_schedule(output.num_scheduled_tokens)
        end = time.perf_counter()
        self.tenant_stats.step(end - start, (before - start) + (end - after))
        if self.step_log:
            self.step_log.scheduled(self, output, start)
        return output

    def _order_running(self) -> None:
        running = self.running
        self._running_counters = {}
        if len(running) < 2:
            return
        pool = self.kv_cache_manager.block_pool
        if len(self.kv_cache_config.kv_cache_groups) == 1 and not may_preempt(
            pool.get_num_free_blocks(), self.max_num_scheduled_tokens, self.block_size, len(running),
            self.num_lookahead_tokens,
        ):  # fmt: skip
            return
        self.running = victims_last(running, self.tracked, self.fair, self.clock())
        if self.fair.traits.ledger:
            tenants = {t.tenant for r in running if (t := self.tracked.get(r.request_id)) is not None}
            self._running_counters = {tenant: self.fair.counter_of(tenant) for tenant in tenants}

    def _note_victims(self, request_ids) -> None:
        counters = self._running_counters
        kept = {t.tenant for r in self.running if (t := self.tracked.get(r.request_id)) is not None}
        largest_kept = max((counters[k] for k in kept if k in counters), default=None)
        for request_id in request_ids:
            tracked = self.tracked.get(request_id)
            if tracked is not None:
                self.tenant_stats.preempted(tracked.tenant, counters.get(tracked.tenant), largest_kept)

    def update_from_output(self, scheduler_output, model_runner_output):
        start = time.perf_counter()
        seen = self.charging.before_update(scheduler_output.num_scheduled_tokens)
        middle = time.perf_counter()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        resumed = time.perf_counter()
        self.charging.after_update(seen)
        self._emit_rejections(outputs)
        self.tenant_stats.update_s += (middle - start) + (time.perf_counter() - resumed)
        self._report()
        if self.step_log:
            self.step_log.updated(scheduler_output, time.perf_counter())
        return outputs

    def _emit_rejections(self, outputs: dict) -> None:
        """Tell vLLM's front end that each rejected request ended (with vLLM's error for a request
        that failed), so that no client waits for it."""
        for tracked in self.rejected:
            vreq = tracked.vreq
            output = EngineCoreOutput(request_id=vreq.request_id, new_token_ids=[],
                                      finish_reason=vreq.get_finished_reason())  # fmt: skip
            outputs.setdefault(vreq.client_index, EngineCoreOutputs(outputs=[])).outputs.append(output)
        self.rejected.clear()

    # -- ends ------------------------------------------------------------------------------------------
    def finish_requests(self, request_ids, finished_status):
        ended = super().finish_requests(request_ids, finished_status)
        now = self.clock()
        for request in ended:
            tracked = self.tracked.get(request.request_id)
            if tracked is None:
                continue
            if finished_status == RequestStatus.FINISHED_ABORTED:
                self.charging.aborted(tracked, now)
            else:
                if tracked.where is Where.RUNNING:
                    self.fair.on_abort(tracked.mirror, now)
                self.tenant_stats.ended(tracked.tenant, "failed")
                self.tracked.drop(tracked)
        self._report()
        return ended

    def has_requests(self) -> bool:
        return bool(self.rejected) or super().has_requests()

    def shutdown(self) -> None:
        if self.step_log:
            self.step_log.close()
        super().shutdown()

    # -- reporting -------------------------------------------------------------------------------------
    def _report(self) -> None:
        now = self.clock()
        if self.tenant_stats.due(now):
            self.tenant_stats.report(now, self.fair_snapshot(), logger)
        elif not self.running and not self.waiting and not self.kv_holding_waiting:
            self.tenant_stats.write(self.fair_snapshot())  # idle: the file holds the final numbers

    def fair_snapshot(self) -> dict:
        return self.tenant_stats.snapshot(self.fair, self.tracked.running_by_tenant(), len(self.tracked))


class FairAsyncScheduler(FairPolicy, AsyncScheduler):
    """The plugin under async scheduling (vLLM's default)."""


class FairSyncScheduler(FairPolicy, Scheduler):
    """The plugin with `--no-async-scheduling`."""


class FairScheduler(FairAsyncScheduler):
    """What `--scheduler-cls slora_vtc.vllm.FairScheduler` names: the plugin under async scheduling,
    or built as FairSyncScheduler when vLLM runs without it."""

    def __new__(cls, *args, **kwargs):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is FairScheduler and not vllm_config.scheduler_config.async_scheduling:
            scheduler = FairSyncScheduler.__new__(FairSyncScheduler)
            scheduler.__init__(*args, **kwargs)
            return scheduler
        return super().__new__(cls)
