"""The order of vLLM's running list, which decides both who gets the step's token budget first and
whom vLLM preempts when KV blocks run out (the last one, again and again: there is no hook). Before
each schedule() where a preemption could happen (`may_preempt`), the plugin orders it victims last
by the scheduler's `victim_order` (slora_vtc/sched/victims.py, which our own chunked batching uses
the same way); otherwise the list keeps vLLM's order and the ordering costs nothing.
"""

from slora_vtc.sched import Scheduler
from slora_vtc.sched.victims import may_preempt
from slora_vtc.vllm.tracked import Requests

__all__ = ["may_preempt", "victims_last"]


def victims_last(running: list, requests: Requests, scheduler: Scheduler, now: float) -> list:
    """`running` (vLLM requests) ordered so that vLLM, taking victims from the end, takes the
    scheduler's. Requests the plugin does not track keep their place at the front."""
    untracked = [r for r in running if requests.get(r.request_id) is None]
    mirrors = [requests.get(r.request_id).mirror for r in running if requests.get(r.request_id) is not None]
    return untracked + [requests.of(m).vreq for m in reversed(scheduler.victim_order(mirrors, now))]
