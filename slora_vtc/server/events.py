"""What the engine thread tells a request's handler on the event loop, and where it sends it."""

import asyncio
from dataclasses import dataclass

from slora_vtc.request import Request, State, TokenLogprob


@dataclass(frozen=True)
class Accepted:
    """The scheduler queued the request."""


@dataclass(frozen=True)
class Tokens:
    ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()  # one per id when the request asked for logprobs


@dataclass(frozen=True)
class Ended:
    state: State
    reason: str
    prompt_tokens: int
    generated: int
    stopped: bool  # ended at EOS

    @classmethod
    def of(cls, req: Request) -> "Ended":
        return cls(req.state, req.reason, req.prompt_len, req.generated, req.stopped)

    @property
    def finish_reason(self) -> str:
        if self.state is State.FINISHED:
            return "stop" if self.stopped else "length"
        return "abort"


Event = Accepted | Tokens | Ended


@dataclass(frozen=True)
class Subscriber:
    """Where a request's events go: an asyncio queue, fed on its own loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
