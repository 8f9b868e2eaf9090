"""What the engine asks of a model: run this prefill, run this decode step, say how long it took."""

from abc import ABC, abstractmethod
from dataclasses import dataclass

from slora_vtc.request import Request


@dataclass(frozen=True)
class StepResult:
    """Next token per request (None when the backend does not produce real tokens) and step time."""

    tokens: list[int | None]
    elapsed: float
    failed: tuple[int, ...] = ()  # indices of requests the model could not serve this step


class ModelBackend(ABC):
    """A forward pass for a batch. Prefill yields each request's first output token."""

    @abstractmethod
    def prefill(self, reqs: list[Request]) -> StepResult:
        """Process the prompts of newly admitted requests."""

    @abstractmethod
    def decode(self, reqs: list[Request]) -> StepResult:
        """Generate one more token for every running request."""

    def release(self, req: Request) -> None:
        """Forget per-request state (sampling state, caches) once the request has left."""
