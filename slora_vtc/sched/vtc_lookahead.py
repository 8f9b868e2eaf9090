"""VTC's exact look-ahead for macro-steps (sched/lookahead.py, slora_vtc/macro_step.py).

While a batch decodes and nothing else happens, each running request's client is charged the same
amount at every step, in the common case a whole number (the linear cost with whole weights w_p,
w_q, unit client weights, no fractional prediction): w_q per token. Then, with integer counters
below 2**52, one product `rate * steps` equals the sum of `steps` single charges exactly (float sums
of integers that small do not round), so `steps` decode steps are charged at once.

The same rates say which waiting client `select` would take first after s steps: the one with the
smallest counter + rate * s (ties: the earlier registration). The first client stays first until
one that grows slower overtakes it, at a step found in integers; so the heads after each step are
a short list of (first step, request) pairs. An arrival whose client has requests waiting joins
the end of its client's queue and changes neither (`queues_behind`). Where any of this does not
hold, the functions answer False / None and the engine takes single steps.
"""

from typing import TYPE_CHECKING

from slora_vtc.cost import LinearCost
from slora_vtc.request import Request

if TYPE_CHECKING:
    from slora_vtc.sched.vtc import VTC

EXACT_BELOW = 2.0**52  # integers up to here, and sums of two, are exact in a float


def _exact(counter: float, added: int) -> bool:
    """A whole counter that stays exact after `added` more."""
    return counter.is_integer() and abs(counter) + added < EXACT_BELOW


def _built_in(vtc: "VTC", method: str) -> bool:
    """Whether `vtc`'s class does `method` as the class that declared its rules to this module did
    (`KNOWN_TO_LOOKAHEAD`): a subclass that charges or selects otherwise must say for itself."""
    cls = type(vtc)
    return getattr(cls, method) is cls.KNOWN_TO_LOOKAHEAD[method]


def whole_token_charge(vtc: "VTC") -> int | None:
    """w_q where the rules of `vtc`'s class and cost make every decode token's charge whole and
    alike (fixed for an instance: VTC keeps it as `decode_token_charge`); None otherwise."""
    cost = vtc.cost
    if not (_built_in(vtc, "on_decode_step") and _built_in(vtc, "token_charge")) or type(cost) is not LinearCost:
        return None
    if not (float(cost.w_p).is_integer() and float(cost.w_q).is_integer() and cost.w_q >= 0):
        return None
    return int(cost.w_q)


def steady_rates(vtc: "VTC", running: list[Request], steps: int) -> dict[str, int] | None:
    """Per client, what each of the next `steps` decode steps of `running` charges it, where that is
    the same every step and whole numbers, so that one product equals the per-step sums exactly;
    None otherwise."""
    w_q = vtc.decode_token_charge
    if w_q is None:
        return None
    rates: dict[str, int] = {}
    if not vtc.refunds and not vtc.weights and vtc.charge_cached in (0, 1):  # every token w_q, whole inputs
        batch = tuple(running)  # requests compare by identity: the same batch as last time, or not
        if vtc.steady_memo is not None and vtc.steady_memo[0] == batch:
            rates = vtc.steady_memo[1]
        else:
            for req in running:
                client = req.client
                rates[client] = rates.get(client, 0) + w_q
            vtc.steady_memo = (batch, rates)
    else:
        for req in running:
            record, client = vtc.records[req.rid], vtc.clients[req.client]
            if record.predicted >= req.generated + steps:  # every one of these tokens was charged up front
                charge = 0
            elif record.predicted <= req.generated and float(record.input).is_integer() and client.weight == 1.0:
                charge = w_q  # h(x, n) - h(x, n - 1), exactly
            else:
                return None
            rates[req.client] = rates.get(req.client, 0) + charge
    clients = vtc.clients
    for name, rate in rates.items():
        if not _exact(clients[name].counter, rate * steps):
            return None
    return rates


def charge_steps(vtc: "VTC", running: list[Request], steps: int) -> bool:
    """Charge `steps` decode steps of `running` at once, where that is exact."""
    rates = steady_rates(vtc, running, steps)
    if rates is None:
        return False
    for name, rate in rates.items():
        vtc.clients[name].counter += rate * steps
    for req in running:
        vtc.records[req.rid].charged = req.generated + steps
    return True


def queues_behind(vtc: "VTC", req: Request) -> bool:
    """An arrival whose client has requests waiting joins the end of its client's queue: its
    client's counter is not lifted, and its head and place among the waiting clients stay."""
    client = vtc.clients.get(req.client)
    return client is not None and bool(client.queue) and _built_in(vtc, "on_arrival") and _built_in(vtc, "peek")


def _overtakes(other: tuple, best: tuple) -> int:
    """The first step s at which `other` (growing slower) comes before `best`: a smaller counter,
    or an equal one and an earlier registration. Both are (counter, order, rate per step, _)."""
    gap, closing = other[0] - best[0], best[2] - other[2]
    s = gap // closing
    return s if gap % closing == 0 and other[1] < best[1] else s + 1


def heads(vtc: "VTC", running: list[Request], steps: int) -> list[tuple[int, Request]] | None:
    """The waiting client with the smallest counter after s steps, its counter growing by its
    running requests' charges: the first client stays first until one that grows slower
    overtakes it (integer counters, so the crossing steps are exact)."""
    rates = steady_rates(vtc, running, steps) if _built_in(vtc, "peek") else None
    if rates is None:
        return None
    waiting = []
    for name, c in vtc.queued.items():
        rate = rates.get(name, 0)
        if not _exact(c.counter, rate * steps):
            return None
        waiting.append((int(c.counter), c.order, rate, c))
    if not waiting:
        return None
    found, s = [], 0
    while s < steps:
        best = min(waiting, key=lambda w, s=s: (w[0] + w[2] * s, w[1]))
        found.append((s, best[3].queue[0]))
        s = min([_overtakes(w, best) for w in waiting if w[2] < best[2]], default=steps)
    return found
