"""Charging a prompt chunk by chunk, as it is computed: what chunked batching (slora_vtc/chunked.py) and
the vLLM plugin (slora_vtc/vllm/charging.py) both do.

A scheduler charges a prompt with one `on_prefill(req, computed, cached, now)`. When the prompt is
computed in chunks, each chunk reports the whole prefill so far, `on_prefill(done - cached, cached)`,
and what the reports before it charged is refunded through the ledger (`Ledger.adjust`), so that the
charges add up to one report of the whole prompt whatever the cost function (h(x, 0) need not be
linear in x). `cached` is the prefix-cache hit at the request's first scheduling; a chunk that does
not pass what was reported before (a request prefilled again after a preemption in mid-prompt)
charges nothing. A scheduler without a ledger cannot be refunded: a prompt charge from it is an
error for the driver to report (`PromptProgress.report` raises `CannotRefund`).
"""

from dataclasses import dataclass

from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler


class CannotRefund(Exception):
    """A scheduler without the ledger trait charged a prompt chunk: the next chunk could not refund it."""


@dataclass
class PromptProgress:
    """One request's prompt charges so far."""

    cached: int  # the prefix-cache hit at its first scheduling
    done: int = 0  # prompt positions reported so far (cached ones included)
    charge: float | None = None  # what the reports so far charged in all, after refunds (None: none yet)

    def report(self, scheduler: Scheduler, req: Request, computed_to: int, now: float) -> float:
        """The prompt is computed up to position `computed_to`: charge it, refund the report before
        it; returns the net charge (0 when nothing new was computed). `req.generated` must be 0."""
        done = min(computed_to, req.prompt_len)
        if self.charge is not None and done <= self.done:
            return 0.0
        previous = self.charge
        self.done = done
        charged = scheduler.on_prefill(req, done - self.cached, self.cached, now)
        if not scheduler.traits.ledger:
            if charged:
                raise CannotRefund(type(scheduler).__name__)
        elif previous:
            scheduler.adjust(req.client, -previous)
            charged -= previous
        self.charge = charged + (previous or 0.0)
        return charged
