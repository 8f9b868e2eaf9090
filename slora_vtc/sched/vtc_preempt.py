"""VTC under preemption (optimistic admission, preemption by recompute), a mixin of VTC.

The victim is the latest arrival of the running client with the largest counter: the client served
most is the one that waits. The victim goes back to the head of its client's queue (ahead of what
arrived after it), and its client re-enters the heap without a lift: it was being served, so it has
no idle credit to lose. It is not charged for its admission again; the token its second prefill
yields is charged as the decode step it was preempted from would have charged it (unless that step
had charged it already), so a preempted request costs what an unpreempted one does. With
charge_recompute, the K/V it computes again (Request.recomputed's count: its prefill minus the cached
tokens minus its newest token, whose K/V was never computed) cost h(recomputed, 0) more.
"""

from slora_vtc.request import Request
from slora_vtc.sched import vtc_lookahead
from slora_vtc.sched.base import arrival_key, recomputed_tokens, requeue, victims_one_by_one


class Preemption:
    """VTC's on_preempt, choose_victim and the charge of a preempted request's next prefill."""

    def on_preempt(self, req: Request, now: float) -> None:
        c = self._client(req.client)
        requeue(c.queue, req)
        if len(c.queue) == 1:  # back into the heap, without a lift: it was being served
            self.queued[req.client] = c
            self.by_counter.push(req.client, c)
        self._waiting += 1

    def choose_victim(self, running: list[Request], now: float) -> Request:
        counters = {name: self.counter_of(name) for name in {r.client for r in running}}
        top = max(counters.values())
        return max([r for r in running if counters[r.client] == top], key=arrival_key)  # keys are unique

    def victim_order(self, running: list[Request], now: float) -> list[Request]:
        """choose_victim's order in one sort: the largest counter first, then the latest arrival."""
        if type(self).choose_victim is not Preemption.choose_victim:
            return victims_one_by_one(self, running, now)
        return _by_counter(running, {name: self.counter_of(name) for name in {r.client for r in running}})

    def victim_order_after(self, running: list[Request], steps: int, now: float) -> list[Request] | None:
        """victim_order once `steps` decode steps of `running` are charged, where the look-ahead
        knows their charges exactly (vtc_lookahead.py)."""
        if type(self).choose_victim is not Preemption.choose_victim:
            return None
        rates = vtc_lookahead.steady_rates(self, running, steps)
        if rates is None:
            return None
        return _by_counter(running, {name: self.counter_of(name) + rates.get(name, 0) * steps for name in rates})

    def readmission_charge(self, req: Request, cached: int) -> float:
        """A preempted request prefilled again: its next token, unless the decode step it was
        preempted from had charged it already; and the recomputation if asked."""
        charged = 0.0
        if self.records[req.rid].charged <= req.generated:
            charged += self._charge(req.client, self.token_charge(req))
        if self.charge_recompute:
            charged += self._charge(req.client, self.cost(recomputed_tokens(req, cached), 0))
        return charged


def _by_counter(running: list[Request], counters: dict[str, float]) -> list[Request]:
    """The largest counter first, then the latest arrival (arrival_key's order, inline: it runs every step)."""
    return sorted(running, key=lambda r: (counters[r.client], r.arrival, r.rid), reverse=True)
