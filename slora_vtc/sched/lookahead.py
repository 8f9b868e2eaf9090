"""The look-ahead capability (`Traits.lookahead`) that macro-steps use (slora_vtc/macro_step.py):
a scheduler that can say what its next decode steps charge and which request its next `select`
would try first lets the simulator run those steps as one, with exactly the results of single steps.
"""

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request


class LookAhead:
    def charge_steps(self, running: list[Request], steps: int, now: float) -> bool:
        """Charge `steps` decode steps of the same batch at once (`now`: the time before the first),
        where the result is exactly that of as many `on_decode_step` calls. Returns whether it did;
        if not (and then it changed nothing), the engine calls on_decode_step before each step, as
        single steps would. The batch is the requests that decode: every running one in the S-LoRA
        loop, a mixed step's decodes under chunked batching (which asks with steps=1 every step)."""
        return False

    def heads(self, running: list[Request], steps: int, budget: AdmissionBudget) -> list[tuple[int, Request]] | None:
        """The request `select` would try first after each of the next `steps` - 1 decode steps of
        `running`, if nothing arrives, finishes or is admitted meanwhile: pairs (first step, request)
        in step order, each request holding until the next pair's step. Only where select admits
        nothing when that request does not fit, and then changes nothing that matters. None: it
        cannot say, and the engine asks select at each such step."""
        return None

    def queues_behind(self, req: Request) -> bool:
        """Whether `on_arrival(req)` now would accept `req` and only queue it behind waiting
        requests that stay ahead of it while nothing is admitted or preempted, reading nothing
        that time changes: then no head changes, and a macro-step that admits and preempts nothing
        may run past its arrival, the request added after it. False: it cannot say."""
        return False
