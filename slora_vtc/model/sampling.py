"""Next-token sampling: greedy, or temperature with optional top-k and top-p (nucleus) filtering;
OpenAI's presence and frequency penalties, HF's repetition penalty, and the raw logprobs of the
model's logits (vLLM's default: before penalties, temperature and filtering)."""

import torch

from slora_vtc.model.sampling_params import MAX_LOGPROBS, SEED_RANGE, SamplingParams

__all__ = ["MAX_LOGPROBS", "SEED_RANGE", "SamplingParams", "apply_penalties", "sample"]


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


def apply_penalties(
    logits: torch.Tensor, output_counts: torch.Tensor, prompt_seen: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
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
