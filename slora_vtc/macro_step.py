"""Macro-steps: on a simulated backend the decode steps between two events run as one, with exactly
the admissions, times and charges of single steps (the engine loop is docs/design.md's).

Single decode steps of one batch are alike until something happens: a request arrives, one
finishes, an admission attempt admits, optimistic admission preempts, or an allocation evicts from
the prefix cache (which changes what waiting requests would reuse). `alike_steps` says how many
steps from now are certain to be alike; the engine then charges them at once
(`LookAhead.charge_steps`), takes their slots at once and lets the backend time them
(`ModelBackend.decode_run`, which also stops at the next arrival that does not queue behind:
`LookAhead.queues_behind`, `Engine.arrival_horizon`). An admission attempt that falls
inside is skipped only where it provably admits nothing: the scheduler names the request its
select would try first after each step (`LookAhead.heads`) and `first_fit` below says when that
request would first fit. Where a scheduler cannot say (no `Traits.lookahead`, or heads is None),
the macro-step ends before the attempt and the attempt runs as usual.

What each scheduler can say (sched/lookahead.py is the interface): FCFS and RPM, their queue's head
(the queue does not move); LPM, the longest match (matches change only with the tree); VTC with the
linear cost, whole-number charges and unit weights, the client with the smallest counter after s
steps (counters of clients with running requests grow by a known whole number per step, so crossings
are exact); weighted, profiled or fractional-prediction VTC and DLPM (whose select refills deficits
even when it admits nothing) cannot, and get macro-steps only between attempts. The conservative
worst case of the running batch alone does not change while it decodes, but with a candidate it can
fall (a request near its end holding much), which is why the fit is computed per step, not assumed.
`Engine.run` with an `on_step` observer runs single steps, so that it sees every one.
"""

from bisect import bisect_right
from itertools import accumulate

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
    steps = min([r.max_new_tokens - r.generated for r in running])  # the step in which one finishes is the last
    if memory.cache is not None:  # no eviction: the tree, and so every match, stays as it is
        steps = min(steps, memory.pool.num_free // len(running))
    elif config.admission == "optimistic":  # no preemption
        steps = min(steps, memory.available // len(running))
    if steps <= first_attempt or scheduler.num_waiting() == 0:
        return steps
    return _until_admission(running, scheduler, Budget(config, running, memory), first_attempt, steps)


def _until_admission(running: list[Request], scheduler: Scheduler, budget: Budget, first: int, steps: int) -> int:
    """The first attempt in [first, steps) that might admit something (steps if none would)."""
    heads = scheduler.heads(running, steps, budget) if scheduler.traits.lookahead else None
    if heads is None:
        return first
    ends = [s for s, _ in heads[1:]] + [steps]
    for (start, req), end in zip(heads, ends):
        fit = first_fit(budget, req, range(max(start, first), end))
        if fit is not None:
            return fit
    return steps


def running_terms(budget: Budget) -> tuple[list[int], list[int], list[int], list[int]]:
    """first_fit's terms of the running batch alone, computed once per budget (nothing is added to
    it): to generate t_i and cumulative held H_i in sorted order, the prefix maxima of the terms
    ahead of a candidate (-1 before any) and the suffix maxima of those behind it, less its held."""
    if budget.terms is None:
        t, cum = [-n for n in budget.neg_to_generate], list(accumulate(budget.held))
        ahead = list(accumulate((ti * (i + 1) + ci for i, (ti, ci) in enumerate(zip(t, cum))), max, initial=-1))
        behind = list(accumulate((ti * (i + 2) + ci for i, (ti, ci) in reversed(list(enumerate(zip(t, cum))))), max))
        budget.terms = (t, cum, ahead, behind[::-1])
    return budget.terms


def first_fit(budget: Budget, req: Request, steps: range) -> int | None:
    """On a budget nothing was added to: the first s in `steps` after which `req` would fit if the
    running batch only decoded s more steps (each running request holding s tokens more and
    generating s fewer; no arrival, finish, admission or eviction); None if after none.

    `Budget.try_add`'s check for every s at once. Sorted by tokens to generate, running entry i
    counts t_i * (i + 1) + H_i while ahead of the candidate and t_i * (i + 2) + H_i + held - s behind it
    (t, H: to generate and cumulative held before the steps); the candidate, p entries ahead,
    counts to_generate * (p + 1) + H_(p-1) + s * p + held. p only falls as s grows, and while it
    stays, the s that fit are an interval found in integers."""
    if budget.full or not steps:
        return None
    costs = budget.costs(req)
    if budget.optimistic:  # what is available only shrinks, by one slot per running request and step
        return steps[0] if costs.now < budget.available - steps[0] * budget.count else None
    limit = budget.config.pool_tokens - (budget.adapter_slots + costs.new_adapter + budget.reserved + costs.locking)
    to_generate, held = req.remaining - 1, costs.extend + 1
    t, cum, ahead, behind_but_held = running_terms(budget)
    s = steps.start
    while s < steps.stop:
        p = bisect_right(budget.neg_to_generate, -(to_generate + s))  # running entries ahead of the candidate
        stop = steps.stop if p == 0 else min(steps.stop, t[p - 1] - to_generate + 1)  # p holds for s in [s, stop)
        if ahead[p] < limit:
            behind = behind_but_held[p] + held if p < len(t) else -1  # the largest term behind the candidate
            first = max(s, behind - limit + 1)
            mine = to_generate * (p + 1) + (cum[p - 1] if p else 0) + held  # + s * p
            if p:
                last = min(stop - 1, (limit - mine - 1) // p)  # mine + s * p < limit
            else:
                last = stop - 1 if mine < limit else first - 1
            if first <= last:
                return first
        s = stop
    return None
