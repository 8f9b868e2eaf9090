"""The scheduler interface. Schedulers see requests, token counts and `now`; never tensors."""

from abc import ABC, abstractmethod
from collections import deque

from slora_vtc.memory.admission import Budget
from slora_vtc.request import Request


class Scheduler(ABC):
    """Decides which waiting requests join the running batch, and in which order.

    The engine calls `on_arrival` for every new request, `select` when it may admit, and
    `on_decode_step` / `on_finish` so that counter-based schedulers can charge service.
    """

    @abstractmethod
    def on_arrival(self, req: Request, now: float) -> bool:
        """Queue the request; return False to reject it (it is then never served)."""

    @abstractmethod
    def select(self, budget: Budget, now: float) -> list[Request]:
        """Pop and return the requests to admit, stopping at the first that does not fit."""

    @abstractmethod
    def num_waiting(self) -> int:
        """Requests queued and not yet admitted."""

    @abstractmethod
    def drain(self) -> list[Request]:
        """Remove and return every waiting request (used when the engine shuts down)."""

    def on_decode_step(self, running: list[Request], now: float) -> None:
        """Called before each decode step with the requests about to get one more token."""

    def on_decode_steps(self, running: list[Request], steps: int, now: float) -> bool:
        """Charge `steps` decode steps of the same batch at once (a macro-step of the simulator;
        `now`: the time before the first), where the result is exactly that of as many
        on_decode_step calls. Returns whether it did; if not (the default), the engine calls
        on_decode_step before each of the steps, as single steps would."""
        return False

    def heads_while_decoding(
        self, running: list[Request], steps: int, budget: Budget
    ) -> list[tuple[int, Request]] | None:
        """The request `select` would try first after each of the next `steps` - 1 decode steps of
        `running`, if nothing arrives, finishes or is admitted meanwhile: pairs (first step, request)
        in step order, each request holding until the next pair's step. Only for a scheduler whose
        select admits nothing when that request does not fit, and then changes nothing that
        matters. None (the default): it cannot say, and the engine asks select at each such step."""
        return None

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> None:
        """Called after a step in which `finished` completed; `batch` still includes them."""

    def remove(self, req: Request) -> bool:
        """Remove one waiting request (an abort); return whether it was waiting."""
        return False

    def on_abort(self, req: Request, now: float) -> None:
        """A running request was aborted: forget what was kept for it."""

    def on_preempt(self, req: Request, now: float) -> None:
        """A running request lost its K/V (optimistic admission ran out of slots): queue it again,
        ahead of what arrived after it. It keeps its generated tokens and is prefilled again later."""
        raise NotImplementedError(f"{type(self).__name__} does not support preemption")

    def choose_victim(self, running: list[Request], now: float) -> Request:
        """The running request to preempt when a decode step cannot get a slot for each one.
        The default, vLLM's: the latest arrival."""
        return max(running, key=lambda r: (r.arrival, r.rid))

    @property
    def supports_preemption(self) -> bool:
        return type(self).on_preempt is not Scheduler.on_preempt

    def waiting_by_client(self) -> dict[str, int]:
        """Waiting requests per client (read-only; for monitoring). Clients with none may be left out."""
        return {}

    def counters(self) -> dict[str, float]:
        """Each known client's service counter (read-only; for monitoring). Empty without counters."""
        return {}

    def counter_of(self, client: str) -> float | None:
        """One client's service counter (for monitoring); None for schedulers without counters."""
        return None

    def weight_of(self, client: str) -> float:
        """One client's share weight (for monitoring); 1 for schedulers without weights."""
        return 1.0

    def adjust(self, client: str, delta: float) -> None:
        """Add `delta` (counter units) to a client's counter: a correction once the service is known,
        or a refund of service that was not delivered. A no-op for schedulers without counters."""

    def forget(self, client: str, now: float) -> bool:
        """Drop what is kept for a client with nothing waiting or running, where dropping it cannot
        change any later decision (each scheduler's docstring says when). True: nothing more can be
        dropped; False: ask again later (some of it may become droppable). The default, for
        schedulers without per-client state: True."""
        return True


def arrival_key(req: Request) -> tuple[float, int]:
    """The order requests arrived in (rid breaks ties, as the engine numbers them in order)."""
    return (req.arrival, req.rid)


def requeue(queue: deque[Request], req: Request) -> None:
    """Put a preempted request back into an arrival-ordered queue: ahead of every request that
    arrived after it, behind those that arrived before it."""
    key = arrival_key(req)
    pos = next((i for i, other in enumerate(queue) if arrival_key(other) > key), len(queue))
    queue.insert(pos, req)


def recomputed_tokens(req: Request, cached: int) -> int:
    """Tokens whose K/V a preempted request's next prefill computes again (as Request.recomputed
    counts them): all but the cached ones and its newest token, whose K/V was never computed."""
    return max(0, req.prefill_len - 1 - cached)
