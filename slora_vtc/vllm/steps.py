"""The plugin's step log (`"step_log": PATH` in its config): one StepRecord (slora_vtc/steplog.py) per
vLLM engine step that computed something, the source `slora-vtc calibrate --vllm-steps` fits the
simulator's step time to (docs/vllm.md).

What a step computed is read after its `schedule()`, from the SchedulerOutput and vLLM's requests
(whose `num_computed_tokens` vLLM has already advanced past the step):

- a request is prefilling from the step that admits it (new, or resumed after a preemption) until
  the step whose chunk reaches its last known token (vLLM's `is_prefill_chunk` turns false); each of
  its steps until then is one chunk, positions [start, start + n) for its n scheduled tokens, and
  adds n to `prefill_tokens`, n x start to `prefill_pairs`, 1 to `prefill_reqs`;
- every other scheduled request decodes: `decode_reqs` counts it and `context_tokens` adds the
  positions it attends over (start + n: its prompt and the tokens generated so far);
- `cached_tokens`: the positions before the first chunk of the requests admitted in the step (the
  prefix-cache hit; for a resumed request, what the cache still held of it);
- `kv_tokens`: KV blocks in use after the step's allocation (blocks not free, less vLLM's null
  block) x the block size; blocks shared by requests count once, the unused tail of a last block in
  full;
- `preempted`: the requests vLLM preempted in that `schedule()`;
- `arrived`: the requests vLLM's engine core handed the scheduler (`add_request`) since the last
  step written was scheduled: when each request reached the engine, past vLLM's HTTP server.

Times come from the caller (the plugin's driver, FairScheduler, keeps the clock): when `schedule()`
began and when the matching `update_from_output()` ended. A step starts when both its `schedule()`
has begun and the step before it has ended; `wall_s` runs from that start to the end of its
`update_from_output()`, `gap_s` is the time between the previous step's end and its `schedule()`,
when the `schedule()` came later (0 otherwise). Without async scheduling (vLLM for CPUs) a step is
schedule(), the model, update_from_output(), and the gap is the engine's work between two steps
(taking in requests, sending outputs). Under async scheduling the next step is scheduled while the
model still runs the one before, so steps overlap: `wall_s` is then the time from the previous
step's end to this one's, the period at which steps come out, and the gap is 0 while steps come back
to back. In both cases the gaps and walls of a log add up to its time from first start to last end.
A step that computed nothing is not written; its time falls into the next step's gap.
"""

from collections import deque
from dataclasses import dataclass
from pathlib import Path

from slora_vtc.steplog import StepLogWriter, StepRecord


@dataclass
class _Pending:
    """A step scheduled and not yet updated: what it computes, and when its schedule() began."""

    output: object
    started: float
    record: dict


class StepLog:
    def __init__(self, path: str | Path):
        self.writer = StepLogWriter(path).open()
        self.pending: deque[_Pending] = deque()
        self.prefilling: set[str] = set()
        self.origin: float | None = None
        self.last_end: float | None = None
        self.steps = 0
        self.arrived = 0  # requests taken in since the last step written was scheduled

    def took_in(self) -> None:
        """vLLM handed the scheduler a request."""
        self.arrived += 1

    def scheduled(self, scheduler, output, started: float) -> None:
        """After `scheduler.schedule()` (begun at `started`) returned `output`."""
        if not output.total_num_scheduled_tokens:
            return
        requests = scheduler.requests
        self.prefilling &= requests.keys()
        admitted = {new.req_id for new in output.scheduled_new_reqs} | set(output.scheduled_cached_reqs.resumed_req_ids)
        self.prefilling |= admitted
        record = dict.fromkeys(("prefill_tokens", "prefill_pairs", "prefill_reqs", "cached_tokens",
                                "decode_reqs", "context_tokens"), 0)  # fmt: skip
        for req_id, n in output.num_scheduled_tokens.items():
            request = requests[req_id]
            end = request.num_computed_tokens
            start = end - n
            if req_id in admitted:
                record["cached_tokens"] += start
            if req_id in self.prefilling:
                record["prefill_tokens"] += n
                record["prefill_pairs"] += n * start
                record["prefill_reqs"] += 1
                if not request.is_prefill_chunk:
                    self.prefilling.discard(req_id)
            else:
                record["decode_reqs"] += 1
                record["context_tokens"] += end
        record["kv_tokens"] = _kv_tokens(scheduler)
        record["preempted"] = len(output.preempted_req_ids or ())
        record["arrived"], self.arrived = self.arrived, 0
        self.pending.append(_Pending(output, started, record))

    def updated(self, output, ended: float) -> None:
        """After `update_from_output(output, ...)` ended at `ended`: the step is written."""
        if not any(step.output is output for step in self.pending):
            return  # a step that computed nothing
        while self.pending[0].output is not output:
            self.pending.popleft()  # never updated (vLLM dropped it): not a step of the log
        step = self.pending.popleft()
        previous_end = step.started if self.last_end is None else self.last_end
        start = max(step.started, previous_end)
        if self.origin is None:
            self.origin = start
        self.writer.write(
            StepRecord(
                step=self.steps, t=start - self.origin, wall_s=ended - start, gap_s=start - previous_end, **step.record
            )  # fmt: skip
        )
        self.steps += 1
        self.last_end = ended

    def close(self) -> None:
        self.writer.close()


def _kv_tokens(scheduler) -> int:
    pool = scheduler.kv_cache_manager.block_pool
    return (pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()) * scheduler.block_size
