"""How one request picks its tokens (SamplingParams), checked, without torch: the HTTP layers
(the server's request bodies, the gateway) read its limits without loading the model's code."""

import math
from dataclasses import dataclass

from slora_vtc.errors import UserError

MAX_LOGPROBS = 20  # the most top logprobs a request may ask for (OpenAI's and vLLM's limit)
SEED_RANGE = 2**64  # torch generators take seeds in [0, 2**64)


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens (the backend's default where a request has none)."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no nucleus filter
    seed: int | None = None  # this request's own generator: same seed -> same tokens, whatever it is batched with
    presence_penalty: float = 0.0  # OpenAI: subtracted once from each token that already appears in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # HF/vLLM: tokens of prompt and output: positive logits / p, negative * p
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's logprob and the k most likely

    def __post_init__(self):
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UserError(f"sampling: {name} must be a finite number, not {value!r}")
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise UserError("sampling needs temperature >= 0, top_k >= 0 and 0 < top_p <= 1")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise UserError(f"sampling: {name} must be in [-2, 2], not {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            raise UserError(f"sampling: repetition_penalty must be > 0, not {self.repetition_penalty}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise UserError(f"sampling: seed must be an integer, not {self.seed!r}")
        if self.logprobs is not None and (
            isinstance(self.logprobs, bool)
            or not isinstance(self.logprobs, int)
            or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise UserError(f"sampling: logprobs must be an integer in [0, {MAX_LOGPROBS}], not {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
