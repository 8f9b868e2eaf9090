"""A request and its life cycle: waiting -> running -> finished (or rejected / aborted)."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the simulator path imports no torch
    from slora_vtc.model.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of a generated token under the model (before penalties and temperature)."""

    logprob: float  # of the token that was chosen
    top: tuple[tuple[int, float], ...] = ()  # the k most likely (id, logprob), most likely first


class State(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"


@dataclass(eq=False)
class Request:
    """One generation request. `max_new_tokens` is its true output length (EOS ignored)."""

    client: str
    prompt_len: int
    max_new_tokens: int
    arrival: float
    rid: int = -1
    adapter: str | None = None  # LoRA adapter; the simulator gives every client its own
    prompt_ids: "Sequence[int] | None" = None  # token ids (a list, or a numpy array for long simulated prompts)
    output_ids: list[int] = field(default_factory=list)
    generated: int = 0
    state: State = State.WAITING
    first_token_time: float | None = None
    finish_time: float | None = None
    kv_slots: list = field(default_factory=list)  # pool slot indices, chunk per allocation
    reason: str = ""  # why a request was rejected or aborted
    stop_tokens: tuple[int, ...] = ()  # end early once one of these is generated (the EOS ids); empty: ignore EOS
    stopped: bool = False
    sampling: "SamplingParams | None" = None  # this request's own sampling (a real backend's default otherwise)
    output_logprobs: list[TokenLogprob] = field(
        default_factory=list
    )  # one per output id when sampling.logprobs is not None
    added_tokens: int = 0  # tokens the serving path put before the client's prompt (a BOS); counted in prompt_len
    cached_len: int = 0  # tokens at the start of its latest prefill whose K/V came from the prefix cache
    cached_tokens: int = 0  # cached_len summed over its prefills (a preempted request is prefilled again)
    preemptions: int = 0
    recomputed: int = 0  # tokens whose K/V were computed again after a preemption
    first_admitted: float | None = None  # when it was first admitted (its queue time ends)

    @property
    def prefill_len(self) -> int:
        """Tokens its next prefill covers: the prompt, and after a preemption the tokens generated so far too."""
        return self.prompt_len + self.generated

    def token_ids(self) -> "list[int] | None":
        """Prompt then generated ids (None when the prompt is only a length)."""
        if self.prompt_ids is None:
            return None
        return [*self.prompt_ids, *self.output_ids]

    @property
    def held_tokens(self) -> int:
        """Tokens of KV this request holds once its next token is written (admission view)."""
        return self.prompt_len + self.generated

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.generated

    @property
    def done(self) -> bool:
        return self.stopped or self.generated >= self.max_new_tokens

    @property
    def ended(self) -> bool:
        return self.state in (State.FINISHED, State.REJECTED, State.ABORTED)

    def append_token(self, token: int | None, now: float) -> None:
        if token is not None:
            self.output_ids.append(token)
            self.stopped = token in self.stop_tokens
        self.generated += 1
        if self.first_token_time is None:
            self.first_token_time = now
