"""Whom a step short of KV blocks preempts, as vLLM does with our plugin (docs/design.md, "Chunked
batching"). vLLM has no hook for choosing a victim: it preempts the last request of its running list,
again and again. So before each step in which a preemption could happen, the running list is
ordered victims last, by the scheduler's `victim_order`; our chunked batching (chunked.py) does the
same with the engine's running list, and the plugin (slora_vtc/vllm/victims.py) with vLLM's.

A preemption cannot happen when the free blocks cover the most a step can ask for: one block per
token-budget's worth of block-size tokens, plus two per running request (a partly filled block at
each end of its new tokens) and its look-ahead slots. Then the list keeps its order (the order of
scheduling) and the ordering costs nothing.
"""

from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler


def may_preempt(free_blocks: int, token_budget: int, block_size: int, running: int, lookahead: int = 0) -> bool:
    per_request = 2 + -(-lookahead // block_size)
    return free_blocks < token_budget // block_size + per_request * running + 1


def victims_last(running: list[Request], scheduler: Scheduler, now: float) -> list[Request]:
    """`running` ordered so that taking victims from the end takes the scheduler's."""
    return scheduler.victim_order(running, now)[::-1]
