"""The admission budget: what a scheduler admits against in one scheduling round."""

from abc import ABC, abstractmethod

from slora_vtc.request import Request


class AdmissionBudget(ABC):
    """Room for requests in one round. A scheduler offers requests in its own order and stops at the
    first that does not fit (head-of-line). Every driver hands one to `Scheduler.select` / `peek`:
    the engine's `Budget` (the pool and S-LoRA's worst-case check, memory/admission.py), the
    gateway's free upstream slots, the router group's one-request budget, and the tests' budgets."""

    @abstractmethod
    def try_add(self, req: Request) -> bool:
        """Whether `req` fits with everything added so far; if it does, it is counted in."""

    def cached_len(self, req: Request) -> int:
        """Tokens of the request's next prefill the prefix cache holds (0: no cache, or no ids)."""
        return 0


class Unlimited(AdmissionBudget):
    """Room for everything, no cache: for a driver that checks capacity itself (the gateway, vLLM)."""

    def try_add(self, req: Request) -> bool:
        return True


UNLIMITED = Unlimited()


class CacheHits(Unlimited):
    """Room for everything, with a memory manager's prefix-cache hits: what chunked batching's
    `peek` and `heads` are given (its step rule decides itself what fits; slora_vtc/chunked.py)."""

    def __init__(self, memory):
        self.memory = memory

    def cached_len(self, req: Request) -> int:
        return self.memory.cached_len(req)
