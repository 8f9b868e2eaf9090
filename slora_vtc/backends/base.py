"""What the engine asks of a model: run this prefill, run this decode step, say how long it took."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slora_vtc.request import Request

if TYPE_CHECKING:  # only for an annotation: the simulator's path imports no numpy
    import numpy as np


@dataclass(frozen=True)
class Chunk:
    """Part of a prefill computed in a mixed step (chunked batching): the request's prefill positions
    [start, start + length), over `req.prefill_len` (prompt, and after a preemption the tokens it had
    generated). Positions before `req.cached_len` come from the prefix cache and are never in a chunk.
    A chunk that reaches `req.prefill_len` completes the prefill and yields the request's next token."""

    req: Request
    start: int
    length: int

    @property
    def completes(self) -> bool:
        return self.start + self.length >= self.req.prefill_len


@dataclass(frozen=True)
class StepResult:
    """Next token per request (None when the backend does not produce real tokens) and step time."""

    tokens: list[int | None]
    elapsed: float
    failed: tuple[int, ...] = ()  # indices of requests the model could not serve this step


class ModelBackend(ABC):
    """A forward pass for a batch. Prefill yields each request's first output token.

    A simulated backend's steps take virtual time (the engine then runs on a VirtualClock); a real
    backend's take the wall-clock time they took.
    """

    simulated: bool = False
    decodes_ahead: bool = False  # whether decode_run can time several decode steps without running them
    mixes: bool = False  # whether `mixed` computes prefill chunks and decodes in one step (chunked batching)

    @abstractmethod
    def prefill(self, reqs: list[Request]) -> StepResult:
        """Process the prompts of newly admitted requests."""

    @abstractmethod
    def decode(self, reqs: list[Request]) -> StepResult:
        """Generate one more token for every running request."""

    def mixed(self, chunks: list[Chunk], decodes: list[Request]) -> StepResult:
        """One step of chunked batching: prefill chunks and one decode token for each of `decodes`,
        in one forward pass. Tokens: one per chunk (None unless it completes its prefill), then one
        per decode, in that order."""
        raise NotImplementedError(f"{type(self).__name__} does not compute mixed prefill-and-decode steps")

    def decode_run(self, reqs: list[Request], steps: int, start: float, until: float) -> tuple[int, float]:
        """Time up to `steps` decode steps of this batch from `start`, each one token longer, and stop
        after the first that ends at or after `until`: (steps run, the time they end). Only where
        `decodes_ahead`: a simulated backend, whose steps produce no tokens."""
        raise NotImplementedError(f"{type(self).__name__} runs one decode step at a time")

    def release(self, req: Request, preempted: bool = False) -> None:  # noqa: B027 (optional hook, a no-op by default)
        """The request left the running batch: forget its per-request state, except what a preempted
        request needs when it comes back (a seeded request's generator)."""

    def has_adapter(self, name: str) -> bool:
        """Whether the backend can serve this LoRA adapter (a simulated one serves any name: it has no weights)."""
        return True

    def load_adapter(self, name: str, slots: "np.ndarray") -> None:  # noqa: B027 (optional hook, a no-op by default)
        """Copy an adapter's weights into the pool slots just allocated for it (MemoryManager's on_load)."""

    def warmup(self) -> None:  # noqa: B027 (optional hook, a no-op by default)
        """Run every kernel once before the clock starts (a real backend compiles on first use)."""
