"""The Llama forward pass over the unified pool (docs/design.md, "Backends").

x = embed(tokens); per layer: x += attention(rms_norm(x)); x += mlp(rms_norm(x));
logits = lm_head(rms_norm(x)) at each request's last token.
attention: q, k, v = W_qkv h; rotate q, k; write k, v into the pool; prefill attends causally
within each prompt, decode attends over the request's slots in the pool (or over the batch's dense copy of
them, `Decode.dense`: model/batch_kv.py); o = W_o attn.
Extend (a prefill whose requests may start with a cached prefix, `Prefill.prefix`): only the tokens
after each request's cached_len are computed, at positions cached_len.., and attend causally over the
request's whole context (cached slots, then the new ones) read through a slot table. A batch without
any cached prefix has prefix None and takes the plain prefill path.
Mixed (chunked batching, `Mixed`): prefill chunks then one decode token per running request, in one
pass. Every per-token op (embedding, projections, norms, rotary, the K/V scatter, the MLP) runs on all
rows at once; attention and LoRA run per part: the chunks as an extend (a chunk's queries sit at
positions start.. and attend over its request's context so far: cached prefix, earlier chunks, itself),
the decodes as decode attention and per-token LoRA. Logits: each chunk's last token, then each decode.
mlp (SwiGLU): W_down (silu(W_gate h) * W_up h).
Each of q, k, v, o, gate, up, down adds its LoRA delta scale * B A x for the requests whose
adapter targets it, every request with its own adapter (ranks may differ within a batch).

Every kernel comes from `ops` (torch references on a CPU, Triton on a GPU), so one model file
serves both backends.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slora_vtc.model.batch_kv import DenseKV
from slora_vtc.model.linear import linear
from slora_vtc.model.pool import KVPool
from slora_vtc.model.rope import inverse_frequencies
from slora_vtc.model.spec import ModelSpec
from slora_vtc.model.weights import LayerWeights, LlamaWeights
from slora_vtc_kernels.reference import LoraRows


@dataclass(frozen=True)
class LoraBatch:
    """The adapters a batch uses: per target module, where every resident adapter's rows lie."""

    rows: dict[str, LoraRows]  # target module -> rows; a module no resident adapter adapts is absent
    ids: torch.Tensor  # [B]: each request's adapter (a row of every LoraRows), -1 for none


@dataclass(frozen=True)
class CachedPrefix:
    """Where each request's whole context lies when some request's first tokens already have K/V in the pool."""

    slot_table: torch.Tensor  # [B, max_ctx]: each request's slots, its cached tokens' then its new tokens'
    cached_lens: torch.Tensor  # [B]: tokens whose K/V were in the pool before this prefill (0: a cold request)


@dataclass(frozen=True)
class Prefill:
    """The tokens each request computes, concatenated without padding: whole prompts, or, with `prefix`,
    what follows each request's cached prefix (positions then start at its cached length)."""

    tokens: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T]: where each token's K/V goes
    cu_seqlens: torch.Tensor  # [B + 1]: offsets of each request's tokens
    max_seqlen: int  # the most tokens of one request (known on the host: kernels size their grids without a sync)
    lora: LoraBatch | None = None
    prefix: CachedPrefix | None = None  # None: no request has a cached prefix (attention within the batch's tokens)

    @property
    def last(self) -> torch.Tensor:
        return self.cu_seqlens[1:] - 1


@dataclass(frozen=True)
class Decode:
    """One new token per request."""

    tokens: torch.Tensor  # [B]
    positions: torch.Tensor  # [B]
    slots: torch.Tensor  # [B]: where the new token's K/V goes
    slot_table: torch.Tensor  # [B, max_len]: each request's slots, the new one included
    seq_lens: torch.Tensor  # [B]
    lora: LoraBatch | None = None
    dense: DenseKV | None = None  # the batch's K/V kept densely across steps (batch_kv.py); None: read the pool


@dataclass(frozen=True)
class Mixed:
    """One step of chunked batching: `chunks` (an extend batch: its prefix's cached_lens are each chunk's
    start) then `decodes`. tokens, positions and slots are all rows, the chunks' then the decodes' (the two
    parts' own fields are views of them)."""

    tokens: torch.Tensor  # [T + D]
    positions: torch.Tensor  # [T + D]
    slots: torch.Tensor  # [T + D]
    chunks: Prefill
    decodes: Decode

    @property
    def split(self) -> int:
        """Rows that belong to chunks (the rest are decodes)."""
        return len(self.chunks.tokens)

    def parts(self) -> list[tuple[Prefill | Decode, slice]]:
        """The parts that have rows, each with its rows of the whole batch."""
        n = self.split
        both = ((self.chunks, slice(None, n)), (self.decodes, slice(n, None)))
        return [(part, rows) for part, rows in both if len(part.tokens)]


Batch = Prefill | Decode | Mixed


class Llama:
    def __init__(self, spec: ModelSpec, weights: LlamaWeights, pool: KVPool, ops):
        self.spec, self.weights, self.pool, self.ops = spec, weights, pool, ops
        self.scale = spec.head_dim**-0.5
        self.inv_freq = inverse_frequencies(spec, weights.embed.device)

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits [B, vocab] (fp32) for each request's next token (Mixed: each chunk's, then each decode's);
        K/V land in the pool."""
        w, eps = self.weights, self.spec.rms_norm_eps
        x = F.embedding(batch.tokens, w.embed)
        for i, layer in enumerate(w.layers):
            x = x + self.attention(i, layer, self.ops.rms_norm(x, layer.attn_norm, eps), batch)
            x = x + self.mlp(i, layer, self.ops.rms_norm(x, layer.mlp_norm, eps), batch)
        if isinstance(batch, Prefill):
            x = x[batch.last]
        elif isinstance(batch, Mixed):
            x = torch.cat([x[batch.chunks.last], x[batch.split :]])
        return linear(self.ops.rms_norm(x, w.norm, eps), w.lm_head).float()

    def attention(self, i: int, layer: LayerWeights, h: torch.Tensor, batch: Batch) -> torch.Tensor:
        s, ops = self.spec, self.ops
        q, k, v = linear(h, layer.wqkv, layer.bqkv).split([s.q_width, s.kv_width, s.kv_width], dim=-1)
        q, k, v = (self.lora(i, h, out, target, batch) for target, out in (("q_proj", q), ("k_proj", k), ("v_proj", v)))
        q, k = ops.rotary_embedding(
            q.view(-1, s.num_heads, s.head_dim), k.view(-1, s.num_kv_heads, s.head_dim), batch.positions, self.inv_freq
        )
        v = v.view(-1, s.num_kv_heads, s.head_dim)
        ops.kv_scatter(k, v, self.pool.k[i], self.pool.v[i], batch.slots)
        if isinstance(batch, Mixed):
            outs = [self.attend(i, q[rows], k[rows], v[rows], part) for part, rows in batch.parts()]
            o = outs[0] if len(outs) == 1 else torch.cat(outs)
        else:
            o = self.attend(i, q, k, v, batch)
        o = o.reshape(-1, s.q_width)
        return self.lora(i, o, linear(o, layer.wo), "o_proj", batch)

    def attend(
        self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Prefill | Decode
    ) -> torch.Tensor:
        """Attention of one kind of batch; its tokens' K/V are in the pool already."""
        ops, k_cache, v_cache = self.ops, self.pool.k[i], self.pool.v[i]
        if isinstance(batch, Prefill) and batch.prefix is None:
            return ops.prefill_attention(q, k, v, batch.cu_seqlens, self.scale, batch.max_seqlen)
        if isinstance(batch, Prefill):  # over each request's whole context, read from the pool
            p = batch.prefix
            return ops.extend_attention(
                q, k_cache, v_cache, batch.cu_seqlens, p.slot_table, p.cached_lens, self.scale, batch.max_seqlen
            )
        if batch.dense is not None:
            return batch.dense.attend(
                i, q, k, v, k_cache, v_cache, batch.slot_table, batch.positions, batch.seq_lens, self.scale
            )
        return ops.decode_attention(q, k_cache, v_cache, batch.slot_table, batch.seq_lens, self.scale)

    def lora(self, i: int, x: torch.Tensor, out: torch.Tensor, target: str, batch: Batch) -> torch.Tensor:
        """out + scale * B A x with each request's own adapter for this module (out itself when none adapts it)."""
        if isinstance(batch, Mixed):  # each part adds its deltas in place, into its rows of one contiguous out
            adapted = [
                (part, rows) for part, rows in batch.parts() if part.lora is not None and target in part.lora.rows
            ]
            out = out.contiguous() if adapted else out
            for part, rows in adapted:
                self.lora(i, x[rows], out[rows], target, part)
            return out
        rows = batch.lora.rows.get(target) if batch.lora is not None else None
        if rows is None:
            return out
        ops, ids, k_cache, v_cache = self.ops, batch.lora.ids, self.pool.k[i], self.pool.v[i]
        out = out.contiguous()
        if isinstance(batch, Prefill):  # one adapter per request's segment of new tokens
            y = ops.lora_shrink_segments(x, k_cache, rows, batch.cu_seqlens, ids, batch.max_seqlen)
            ops.lora_expand_segments(y, v_cache, rows, batch.cu_seqlens, ids, out, batch.max_seqlen)
        else:
            y = ops.lora_shrink(x, k_cache, rows, ids)
            ops.lora_expand(y, v_cache, rows, ids, out)
        return out

    def mlp(self, i: int, layer: LayerWeights, h: torch.Tensor, batch: Batch) -> torch.Tensor:
        gate, up = linear(h, layer.w_gate_up).chunk(2, dim=-1)
        gate, up = self.lora(i, h, gate, "gate_proj", batch), self.lora(i, h, up, "up_proj", batch)
        act = F.silu(gate).mul_(up)  # in place: one activation-sized tensor less (a prefill's are megabytes)
        return self.lora(i, act, linear(act, layer.w_down), "down_proj", batch)
