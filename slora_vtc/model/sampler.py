"""A batch's next tokens, each request sampled its own way, with the state that takes across steps.

Rows with identical SamplingParams are sampled together. Per request the sampler keeps:
- its own generator when it has a seed (made at its first sampled token), so that a seeded request
  draws the same tokens alone or in any batch; it survives a preemption (the draws go on where they
  were) and goes when the request leaves for good (finished or aborted);
- for a penalised request, its output token counts and its prompt's tokens on the device (built from
  its ids when it is prefilled, one count more per sampled token), dropped at every release (a
  preempted request's are rebuilt at its next prefill from the same ids).
Logprobs are the raw ones (vLLM's default): log_softmax of the model's logits, before penalties,
temperature and filtering.
"""

from dataclasses import dataclass

import torch

from slora_vtc.model.sampling import SEED_RANGE, SamplingParams, apply_penalties, sample
from slora_vtc.request import Request, TokenLogprob


@dataclass
class _Seen:
    """A penalised request's tokens: output counts [V] and prompt membership [V] (rows of its last batch's tensors)."""

    output: torch.Tensor
    prompt: torch.Tensor


class BatchSampler:
    """Samples a batch's rows, each request with its own parameters (the default where it has none)."""

    def __init__(self, default: SamplingParams, shared: torch.Generator, vocab_size: int, device: torch.device):
        self.default, self.shared, self.vocab_size, self.device = default, shared, vocab_size, device
        self._generators: dict[int, torch.Generator] = {}
        self._seen: dict[int, _Seen] = {}

    def sample(self, reqs: list[Request], logits: torch.Tensor) -> tuple[torch.Tensor, list[TokenLogprob | None]]:
        """logits [B, V], one row per request -> next token per row [B], and each row's logprobs (None
        where not asked)."""
        params = [r.sampling or self.default for r in reqs]
        if all(p == params[0] for p in params) and _plain(params[0]):
            return sample(logits, params[0], self.shared), [None] * len(reqs)
        nxt = torch.empty(len(reqs), dtype=torch.int64, device=self.device)
        for p in dict.fromkeys(params):  # one group per distinct setting, in first-seen order
            rows = [i for i, q in enumerate(params) if q == p]
            nxt[rows] = self._sample_group([reqs[i] for i in rows], logits[rows], p)
        return nxt, self._logprobs(params, logits, nxt)

    def release(self, req: Request, preempted: bool = False) -> None:
        """The request left the running batch: for good, or preempted (then it keeps its generator)."""
        self._seen.pop(req.rid, None)
        if not preempted:
            self._generators.pop(req.rid, None)

    # -- one group of rows that share their parameters ---------------------------------------------
    def _sample_group(self, reqs: list[Request], logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
        if p.penalised:
            output, prompt = self._seen_rows(reqs)
            logits = apply_penalties(logits, output, prompt, p)
        if p.seed is None or p.greedy:
            nxt = sample(logits, p, self.shared)
        else:  # each seeded request draws from its own generator, whatever else is in the batch
            nxt = torch.cat([sample(logits[i : i + 1], p, self._generator(r, p.seed)) for i, r in enumerate(reqs)])
        if p.penalised:
            output[torch.arange(len(reqs), device=self.device), nxt] += 1
            for r, out_row, prompt_row in zip(reqs, output, prompt):
                self._seen[r.rid] = _Seen(out_row, prompt_row)
        return nxt

    def _generator(self, req: Request, seed: int) -> torch.Generator:
        if req.rid not in self._generators:
            self._generators[req.rid] = torch.Generator(device=self.device).manual_seed(seed % SEED_RANGE)
        return self._generators[req.rid]

    def _seen_rows(self, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """Output counts and prompt membership of these requests, [B, V] each (new tensors: the caller may
        write them)."""
        missing = [r for r in reqs if r.rid not in self._seen]
        if missing:
            output, prompt = (
                self._count(r.output_ids for r in missing),
                self._count(() if r.prompt_ids is None else r.prompt_ids for r in missing) > 0,
            )
            self._seen.update((r.rid, _Seen(o, q)) for r, o, q in zip(missing, output, prompt))
        seen = [self._seen[r.rid] for r in reqs]
        return torch.stack([s.output for s in seen]), torch.stack([s.prompt for s in seen])

    def _count(self, id_lists) -> torch.Tensor:
        """[B, V] occurrences of each token id in each list, from one host-to-device copy."""
        id_lists = [list(ids) for ids in id_lists]
        rows = [i for i, ids in enumerate(id_lists) for _ in ids]
        where = torch.tensor([rows, [t for ids in id_lists for t in ids]], dtype=torch.int64).to(self.device)
        counts = torch.zeros((len(id_lists), self.vocab_size), dtype=torch.int32, device=self.device)
        return counts.index_put_(
            (where[0], where[1]), torch.ones(len(rows), dtype=torch.int32, device=self.device), accumulate=True
        )

    # -- logprobs ------------------------------------------------------------------------------------
    def _logprobs(
        self, params: list[SamplingParams], logits: torch.Tensor, nxt: torch.Tensor
    ) -> list[TokenLogprob | None]:
        asked = [i for i, p in enumerate(params) if p.logprobs is not None]
        out: list[TokenLogprob | None] = [None] * len(params)
        if not asked:
            return out
        raw = logits[asked].float().log_softmax(-1)
        chosen = raw.gather(1, nxt[asked].unsqueeze(1)).squeeze(1).tolist()
        k = min(max(params[i].logprobs for i in asked), raw.shape[-1])
        top_values, top_ids = raw.topk(k, dim=-1) if k else (raw[:, :0], raw[:, :0].long())
        for i, lp, values, ids in zip(asked, chosen, top_values.tolist(), top_ids.tolist()):
            n = params[i].logprobs
            out[i] = TokenLogprob(lp, tuple(zip(ids[:n], values[:n])))
        return out


def _plain(p: SamplingParams) -> bool:
    """Whether a batch sharing these parameters samples in one call from the shared generator, as it always has."""
    return (p.seed is None or p.greedy) and not p.penalised and p.logprobs is None
