"""Next-token sampling: greedy, or temperature with optional top-k and top-p (nucleus) filtering;
OpenAI's presence and frequency penalties, HF's repetition penalty, and the raw logprobs of the
model's logits (vLLM's default: before penalties, temperature and filtering)."""

import math
from dataclasses import dataclass

import torch

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
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise UserError(f"sampling: logprobs must be an integer in [0, {MAX_LOGPROBS}], not {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits: [B, V] -> next token per row [B] (int64)."""
    if params.greedy:
        return logits.argmax(-1)
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        logits = _top_p(logits, params.top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(-1)
    drop = probs.cumsum(-1) - probs >= top_p  # the mass before a token already reaches top_p
    return logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))


def apply_penalties(logits: torch.Tensor, output_counts: torch.Tensor, prompt_seen: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [B, V] of rows sharing `params`; output_counts [B, V]: each token's occurrences in the row's
    output; prompt_seen [B, V]: whether it occurs in the prompt. The repetition penalty (HF's and vLLM's)
    covers prompt and output, the presence and frequency penalties (OpenAI's) the output only."""
    logits = logits.float()
    in_output = output_counts > 0
    if params.repetition_penalty != 1:
        scaled = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
        logits = torch.where(prompt_seen | in_output, scaled, logits)
    if params.frequency_penalty:
        logits = logits - params.frequency_penalty * output_counts
    if params.presence_penalty:
        logits = logits - params.presence_penalty * in_output
    return logits
