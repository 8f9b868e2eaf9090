"""Next-token sampling: greedy, or temperature with optional top-k and top-p (nucleus) filtering."""

from dataclasses import dataclass

import torch

from slora_vtc.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no nucleus filter

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise UserError("sampling needs temperature >= 0, top_k >= 0 and 0 < top_p <= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


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
