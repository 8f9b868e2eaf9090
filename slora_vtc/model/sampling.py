"""Next-token sampling: greedy, or temperature with optional top-k and top-p (nucleus) filtering;
OpenAI's presence and frequency penalties, HF's repetition penalty, and the raw logprobs of the
model's logits (vLLM's default: before penalties, temperature and filtering).

The logits are float32: every factor a request may give (a temperature or a repetition penalty of
5e-324, a top_p of 1e-300) is used so that it cannot round to 0 or overflow into inf or NaN; at such
extremes sampling tends to its limit (the most likely token) instead of failing.
"""

import torch

from slora_vtc.model.sampling_params import MAX_LOGPROBS, SEED_RANGE, SamplingParams

__all__ = ["MAX_LOGPROBS", "SEED_RANGE", "SamplingParams", "apply_penalties", "sample"]

FLOAT32 = torch.finfo(torch.float32)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits: [B, V] -> next token per row [B] (int64)."""
    if params.greedy:
        return logits.argmax(-1)
    logits = _tempered(logits.float(), params.temperature)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        logits = _top_p(logits, params.top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature, less the row's largest (softmax is the same): the largest becomes 0, never
    inf - inf; a temperature below float32's smallest normal divides as that one (it would round to 0)."""
    finite = logits.clamp(-FLOAT32.max, FLOAT32.max)  # a penalty may have overflowed a logit to +-inf
    return (finite - finite.amax(-1, keepdim=True)) / max(temperature, FLOAT32.tiny)


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p: the most likely one always
    (a top_p below float32's smallest value rounds to 0, which the mass before it already reaches)."""
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(-1)
    drop = probs.cumsum(-1) - probs >= top_p  # the mass before a token already reaches top_p
    drop[:, 0] = False
    return logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))


def apply_penalties(
    logits: torch.Tensor, output_counts: torch.Tensor, prompt_seen: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
    """logits [B, V] of rows sharing `params`; output_counts [B, V]: each token's occurrences in the row's
    output; prompt_seen [B, V]: whether it occurs in the prompt. The repetition penalty (HF's and vLLM's)
    covers prompt and output, the presence and frequency penalties (OpenAI's) the output only."""
    logits = logits.float()
    in_output = output_counts > 0
    if params.repetition_penalty != 1:
        penalty = min(max(params.repetition_penalty, FLOAT32.tiny), FLOAT32.max)  # as float32: never 0, never inf
        scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(prompt_seen | in_output, scaled, logits)
    if params.frequency_penalty:
        logits = logits - params.frequency_penalty * output_counts
    if params.presence_penalty:
        logits = logits - params.presence_penalty * in_output
    return logits
