"""Macro-steps: on a simulated backend the decode steps between two events run as one, with exactly
the admissions, times and charges of single steps (the engine loop is docs/design.md's).

Single decode steps of one batch are alike until something happens: a request arrives, one
finishes, an admission attempt admits, optimistic admission preempts, or an allocation evicts from
the prefix cache (which changes what waiting requests would reuse). `alike_steps` says how many
steps from now are certain to be alike; the engine then charges them at once
(`Scheduler.on_decode_steps`), takes their slots at once and lets the backend time them
(`ModelBackend.decode_run`, which also stops at the next arrival). An admission attempt that falls
inside is skipped only where it provably admits nothing: the scheduler names the request its
select would try first after each step (`Scheduler.heads_while_decoding`) and the budget says
when that request would first fit (`Budget.first_fit`). Where a scheduler cannot say, the
macro-step ends before the attempt and the attempt runs as usual.

What each scheduler can say: FCFS and RPM, their queue's head (the queue does not move); LPM, the
longest match (matches change only with the tree); VTC with the linear cost, whole-number
charges and unit weights, the client with the smallest counter after s steps (counters of clients
with running requests grow by a known whole number per step, so crossings are exact); weighted,
profiled or fractional-prediction VTC and DLPM (whose select refills deficits even when it
admits nothing) cannot, and get macro-steps only between attempts. The conservative worst case
of the running batch alone does not change while it decodes, but with a candidate it can fall
(a request near its end holding much), which is why the fit is computed per step, not assumed.
`Engine.run` with an `on_step` observer runs single steps, so that it sees every one.
"""

from slora_vtc.config import EngineConfig
from slora_vtc.memory import Budget, MemoryManager
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler


def alike_steps(
    running: list[Request], scheduler: Scheduler, memory: MemoryManager, config: EngineConfig, first_attempt: int
) -> int:
    """Decode steps of `running` from now that single steps would run alike, the engine asking the
    scheduler after `first_attempt` of them and after every one from then on (0: not one, as a
    preemption, an eviction or an admission may come first); arrivals are the backend's to stop at."""
    steps = min(r.remaining for r in running)  # the step in which one finishes is the last
    if memory.cache is not None:  # no eviction: the tree, and so every match, stays as it is
        steps = min(steps, memory.pool.num_free // len(running))
    elif config.admission == "optimistic":  # no preemption
        steps = min(steps, memory.available // len(running))
    if steps <= first_attempt or scheduler.num_waiting() == 0:
        return steps
    return _until_admission(running, scheduler, Budget(config, running, memory), first_attempt, steps)


def _until_admission(running: list[Request], scheduler: Scheduler, budget: Budget, first: int, steps: int) -> int:
    """The first attempt in [first, steps) that might admit something (steps if none would)."""
    heads = scheduler.heads_while_decoding(running, steps, budget)
    if heads is None:
        return first
    ends = [s for s, _ in heads[1:]] + [steps]
    for (start, req), end in zip(heads, ends):
        fit = budget.first_fit(req, range(max(start, first), end))
        if fit is not None:
            return fit
    return steps
