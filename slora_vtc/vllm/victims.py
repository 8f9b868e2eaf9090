"""The order of vLLM's running list, which decides both who gets the step's token budget first and
whom vLLM preempts when KV blocks run out (the last one, again and again: there is no hook). Before
each schedule() where a preemption could happen, the plugin orders it by asking the scheduler's
`choose_victim` repeatedly: its victim last, then the victim among the rest, and so on.

A preemption cannot happen when the free blocks cover the most a step can ask for: one block per
token-budget's worth of block-size tokens, plus two per running request (a partly filled block at
each end of its new tokens) and its look-ahead slots. Then the list keeps vLLM's order and the
ordering costs nothing (it is O(running²) scheduler calls otherwise).
"""

from slora_vtc.sched import Scheduler
from slora_vtc.vllm.tracked import Requests


def may_preempt(free_blocks: int, token_budget: int, block_size: int, running: int, lookahead: int) -> bool:
    per_request = 2 + -(-lookahead // block_size)
    return free_blocks < token_budget // block_size + per_request * running + 1


def victims_last(running: list, requests: Requests, scheduler: Scheduler, now: float) -> list:
    """`running` (vLLM requests) ordered so that vLLM, taking victims from the end, takes the
    scheduler's. Requests the plugin does not track keep their place at the front."""
    untracked = [r for r in running if requests.get(r.request_id) is None]
    remaining = [requests.get(r.request_id).mirror for r in running if requests.get(r.request_id) is not None]
    chosen = []
    while remaining:
        victim = scheduler.choose_victim(remaining, now)
        remaining.remove(victim)
        chosen.append(requests.of(victim).vreq)
    return untracked + chosen[::-1]
