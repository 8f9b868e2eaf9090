"""The real backend: a Llama model behind the same engine and schedulers as the simulator.

Steps are timed on the wall clock (after a device sync). Per running request the backend keeps,
on the device, a row of a slot table (the request's pool slots), its length, its last token and
its adapter; a decode step reads the batch's rows with one gather instead of rebuilding tensors
from Python lists. A prefill covers each request's `prefill_len` tokens (its prompt, and after a
preemption the tokens it generated: its next token comes from the last one) but computes only those
after its `cached_len` (a prefix-cache hit: `kv_slots[:cached_len]` already hold their K/V); a batch
with any cached prefix runs the model's extend path, a batch without one the plain prefill. The
request's row gets all its slots, cached ones included. A prompt given only as a length gets random
ids at its first prefill, kept on the request (`prompt_ids`). A step that raises is retried request
by request, so one failing request is reported in StepResult.failed (the engine aborts it) while the
others keep being served.

A mixed step (chunked batching, `mixed`) computes prefill chunks and decode tokens in one pass
(model/llama.py's Mixed). A chunk covers positions [start, start + length) of its request's prefill;
its row of the slot table gets the slots of positions [0, start + length) (`kv_slots` may hold more:
slots allocated by block), and its queries attend over them (an extend whose cached length is the
chunk's start). Across the chunks of one prefill the request keeps its row (slots, adapter, tokens
computed), its dummy prompt ids (drawn at its first chunk) and its seeded generator; the host
remembers where its next chunk must start. Only the chunk that completes the prefill samples, as
`prefill` would. A decode's new token goes in `kv_slots[held_tokens - 1]`, in both kinds of step.
"""

import logging
import os
import time
from itertools import accumulate, chain
from typing import NamedTuple

import numpy as np
import torch

from slora_vtc.backends.base import Chunk, ModelBackend, StepResult
from slora_vtc.errors import UserError
from slora_vtc.model.adapters import TARGETS, AdapterSpec, AdapterTable, slots_per_row
from slora_vtc.model.batch_kv import BatchKV
from slora_vtc.model.linear import can_pack, packed_weights
from slora_vtc.model.llama import CachedPrefix, Decode, Llama, LoraBatch, Mixed, Prefill
from slora_vtc.model.lora import dummy_adapter, peft_adapter, write_adapter
from slora_vtc.model.ops import load_ops
from slora_vtc.model.pool import KVPool
from slora_vtc.model.sampler import BatchSampler
from slora_vtc.model.sampling_params import SamplingParams
from slora_vtc.model.spec import ModelSpec, resolve_spec
from slora_vtc.model.weights import load_weights
from slora_vtc.request import Request, TokenLogprob
from slora_vtc_kernels.reference import LoraRows

log = logging.getLogger(__name__)

BACKEND_OPS = {"torch": "torch", "triton": "triton"}
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
FIRST_DUMMY_TOKEN = 3  # dummy prompts avoid the special tokens 0-2 (unk, bos, eos in Llama's vocabulary)
SMALL_HIDDEN = 1024  # up to this hidden size, a CPU step runs single-threaded (see build_backend)
WARMUP_RANK = 8


class RequestRows:
    """Device-side state of the running requests, one row each; rows are reused after release."""

    def __init__(self, device: torch.device):
        self.device = device
        self.table = torch.zeros((0, 0), dtype=torch.int64, device=device)  # pool slots, by position
        self.lens = torch.zeros(0, dtype=torch.int64, device=device)  # tokens whose K/V are in the pool
        self.last = torch.zeros(0, dtype=torch.int64, device=device)  # the token the next decode step feeds
        self.adapter = torch.zeros(0, dtype=torch.int64, device=device)  # row of the adapter table, -1 none
        self.row_of: dict[int, int] = {}
        self._free: list[int] = []

    def add(self, rids: list[int], capacity: int) -> list[int]:
        """Rows for new requests (a request that has one keeps it), each able to hold `capacity` slots."""
        new = [rid for rid in rids if rid not in self.row_of]
        more = max(0, len(new) - len(self._free))
        if more or capacity > self.table.shape[1]:
            self._grow(more, capacity)
        self.row_of.update((rid, self._free.pop()) for rid in new)
        return [self.row_of[rid] for rid in rids]

    def remove(self, rid: int) -> None:
        row = self.row_of.pop(rid, None)
        if row is not None:
            self._free.append(row)

    def _grow(self, more_rows: int, min_cols: int) -> None:
        old_rows, old_cols = self.table.shape
        rows = max(old_rows + more_rows, 2 * old_rows, 8) if more_rows else old_rows
        cols = max(min_cols, old_cols)
        table = torch.zeros((rows, cols), dtype=torch.int64, device=self.device)
        table[:old_rows, :old_cols] = self.table
        self.table = table
        self.lens, self.last, self.adapter = (
            torch.cat([t, t.new_zeros(rows - old_rows)]) for t in (self.lens, self.last, self.adapter)
        )
        self._free.extend(range(rows - 1, old_rows - 1, -1))


class AdapterRows:
    """Device-side table of the resident adapters: their slots and, per target module, their rows.

    An adapter keeps its row of the table across evictions and reloads (its slots change).
    """

    def __init__(self, model: ModelSpec, device: torch.device):
        self.model, self.device = model, device
        self.index: dict[str, int] = {}
        self.specs: list[AdapterSpec] = []
        self.slots = torch.zeros((0, 0), dtype=torch.int64, device=device)
        self._rows: dict[str, LoraRows] = {}

    def put(self, adapter: AdapterSpec, slots: torch.Tensor) -> None:
        row = self.index.setdefault(adapter.name, len(self.index))
        if row == len(self.specs):
            self.specs.append(adapter)
        if row >= self.slots.shape[0] or len(slots) > self.slots.shape[1]:
            grown = self.slots.new_zeros((max(8, 2 * row, self.slots.shape[0]), max(len(slots), self.slots.shape[1])))
            grown[: self.slots.shape[0], : self.slots.shape[1]] = self.slots
            self.slots = grown
        self.slots[row, : len(slots)] = slots
        self._rows = self._build_rows()

    def batch(self, ids: torch.Tensor) -> LoraBatch:
        return LoraBatch(self._rows, ids)

    def _build_rows(self) -> dict[str, LoraRows]:
        rows = {}
        scales = torch.tensor([a.scale for a in self.specs], dtype=torch.float32, device=self.device)
        layouts = [a.layout(self.model) for a in self.specs]
        for target in TARGETS:
            where = [layout.get(target) for layout in layouts]
            if not any(where):
                continue
            ranks = [a.rank if w else 0 for a, w in zip(self.specs, where)]
            starts = [w[0] if w else 0 for w in where]
            rows[target] = LoraRows(
                self.slots[: len(self.specs)],
                torch.tensor(starts, device=self.device),
                torch.tensor(ranks, device=self.device),
                scales,
                max(ranks),
                slots_per_row(self.model, target),
            )
        return rows


class _After(NamedTuple):
    """What a mixed step changes in the request rows once it has run (on the device)."""

    rows: torch.Tensor  # the chunks' rows, then the decodes'
    lens: torch.Tensor  # their tokens in the pool after the step
    chunk_rows: torch.Tensor
    chunk_adapters: torch.Tensor
    sampled: torch.Tensor  # the logits rows sampled: the chunks that complete their prefill, then the decodes
    last_rows: torch.Tensor  # their requests' rows, whose next decode feeds the token sampled


class LlamaBackend(ModelBackend):
    mixes = True

    def __init__(
        self,
        model: Llama,
        sampling: SamplingParams = SamplingParams(),
        adapters: AdapterTable = AdapterTable(),
        seed: int = 0,
    ):
        self.model, self.spec, self.device = model, model.spec, model.device
        self.sampling, self.adapters, self.seed = sampling, adapters, seed
        self.rows = RequestRows(self.device)
        self.resident = AdapterRows(self.spec, self.device)
        self._host_weights = {
            a.name: peft_adapter(self.spec, a) for a in adapters.adapters if a.path is not None
        }  # read (and checked) once
        self._gen = torch.Generator(device=self.device).manual_seed(seed)  # dummy prompts, and unseeded sampling
        self.sampler = BatchSampler(sampling, self._gen, self.spec.vocab_size, self.device)
        # kernels whose decode attention gathers the context from the pool: keep the batch's K/V densely instead
        self.batch_kv = BatchKV(model.pool.k) if getattr(model.ops, "gathers_decode_kv", False) else None
        self.on_logits = None  # observer for tests and debugging: on_logits(requests, logits [B, vocab]) sampled from
        self._prefilling: dict[int, int] = {}  # rid -> positions computed so far, of a prefill that spans mixed steps

    # -- the engine's interface ------------------------------------------------------------
    def prefill(self, reqs: list[Request]) -> StepResult:
        skip = {i for i, r in enumerate(reqs) if self._bad_prompt(r, r.prefill_len)}
        return self._timed(self._prefill, reqs, reqs, skip)

    def decode(self, reqs: list[Request]) -> StepResult:
        return self._timed(self._decode, reqs, reqs)

    def mixed(self, chunks: list[Chunk], decodes: list[Request]) -> StepResult:
        items = [*chunks, *decodes]
        skip = {i for i, c in enumerate(chunks) if self._bad_chunk(c)}
        skip.update(len(chunks) + i for i, r in enumerate(decodes) if self._bad_decode(r))
        return self._timed(self._mixed, items, [c.req for c in chunks] + decodes, skip)

    def release(self, req: Request, preempted: bool = False) -> None:
        self._invalidate_dense()
        self.rows.remove(req.rid)
        self._prefilling.pop(req.rid, None)
        self.sampler.release(req, preempted)

    def has_adapter(self, name: str) -> bool:
        return name in self.adapters

    @torch.inference_mode()
    def load_adapter(self, name: str, slots: np.ndarray) -> None:
        """MemoryManager's on_load hook: copy the adapter's weights into its freshly allocated slots."""
        adapter = self.adapters.get(name)
        slots_t = torch.as_tensor(slots, dtype=torch.int64, device=self.device)
        if len(slots_t) != adapter.slots(self.spec):
            raise ValueError(f"adapter '{name}' needs {adapter.slots(self.spec)} slots, the pool gave {len(slots_t)}")
        self._invalidate_dense()
        weights = self._host_weights.get(name) or dummy_adapter(
            self.spec, adapter, self.device, self.model.weights.embed.dtype, self.seed
        )
        write_adapter(self.model.pool, slots_t, weights, self.spec)
        self.resident.put(adapter, slots_t)

    # -- steps ----------------------------------------------------------------------------
    def _timed(self, run, items: list, reqs: list[Request], skip: set[int] = frozenset()) -> StepResult:
        """run(some items) -> (token, logprobs) per item; items[i] is for reqs[i] (a request, or a chunk of it)."""
        start = time.perf_counter()
        tokens: list[int | None] = [None] * len(reqs)
        logprobs: list[TokenLogprob | None] = [None] * len(reqs)
        failed = set(skip)
        todo = [i for i in range(len(reqs)) if i not in skip]
        try:
            if todo:
                for i, t, lp in zip(todo, *run([items[i] for i in todo])):
                    tokens[i], logprobs[i] = t, lp
        except Exception as batch_error:  # isolate the failing requests: retry one by one
            self._invalidate_dense()
            log.warning("a batch of %d failed (%s); retrying request by request", len(todo), batch_error)
            for i in todo:
                try:
                    (tokens[i],), (logprobs[i],) = run([items[i]])
                except Exception as e:
                    log.warning("request %d failed in the model: %s", reqs[i].rid, e)
                    failed.add(i)
        self._sync()
        for req, lp in zip(reqs, logprobs):  # the engine appends the token of each request that did not fail
            if lp is not None:
                req.output_logprobs.append(lp)
        return StepResult(tokens, time.perf_counter() - start, tuple(sorted(failed)))

    @torch.inference_mode()
    def _prefill(self, reqs: list[Request]) -> tuple[list[int], list[TokenLogprob | None]]:
        self._invalidate_dense()
        ids = self._prefill_ids(reqs)
        full = [r.prefill_len for r in reqs]
        cached = [r.cached_len for r in reqs]
        new = [f - c for f, c in zip(full, cached)]
        rows = self.rows.add([r.rid for r in reqs], max(r.prompt_len + r.max_new_tokens for r in reqs))
        adapters = [self._adapter_of(r) for r in reqs]
        n_ctx, n_new, b = sum(full), sum(new), len(reqs)
        host = torch.tensor(
            [
                *chain.from_iterable(r.kv_slots[: r.prefill_len] for r in reqs),
                *chain.from_iterable(i[c:] for i, c in zip(ids, cached)),
                0,
                *accumulate(new),
                0,
                *accumulate(full),
                *rows,
                *adapters,
                *full,
                *cached,
            ]
        )
        ctx_slots, tokens, cu_t, cu_ctx, rows_t, adapter_t, full_t, cached_t = host.to(self.device).split(
            [n_ctx, n_new, b + 1, b + 1, b, b, b, b]
        )
        # every context slot (cached ones included) goes into the request's row: decode and an extend read them there
        ctx_positions = torch.arange(n_ctx, device=self.device) - torch.repeat_interleave(
            cu_ctx[:-1], full_t, output_size=n_ctx
        )
        self.rows.table[torch.repeat_interleave(rows_t, full_t, output_size=n_ctx), ctx_positions] = ctx_slots
        if any(cached):
            new_t = full_t - cached_t
            positions = torch.arange(n_new, device=self.device) - torch.repeat_interleave(
                cu_t[:-1] - cached_t, new_t, output_size=n_new
            )
            slots = self.rows.table[torch.repeat_interleave(rows_t, new_t, output_size=n_new), positions]
            prefix = CachedPrefix(self.rows.table[rows_t, : max(full)], cached_t)
        else:  # every request is cold: the plain prefill path, its tokens the whole context
            positions, slots, prefix = ctx_positions, ctx_slots, None
        lora = self.resident.batch(adapter_t) if max(adapters) >= 0 else None
        logits = self.model.forward(Prefill(tokens, positions, slots, cu_t, max(new), lora, prefix))
        nxt, logprobs = self._sample(reqs, logits)
        self.rows.lens[rows_t], self.rows.last[rows_t], self.rows.adapter[rows_t] = full_t, nxt, adapter_t
        return nxt.tolist(), logprobs

    @torch.inference_mode()
    def _decode(self, reqs: list[Request]) -> tuple[list[int], list[TokenLogprob | None]]:
        rows, new_slots = torch.tensor(
            [[self.rows.row_of[r.rid] for r in reqs], [r.kv_slots[r.held_tokens - 1] for r in reqs]]
        ).to(self.device)
        positions = self.rows.lens[rows]
        self.rows.table[rows, positions] = new_slots
        seq_lens = positions + 1
        max_len = max(r.held_tokens for r in reqs)  # == max(seq_lens), known on the host without a sync
        lora = self.resident.batch(self.rows.adapter[rows]) if any(self._adapter_of(r) >= 0 for r in reqs) else None
        dense = self._dense(reqs, max_len)
        table = self.rows.table[rows, :max_len]
        batch = Decode(self.rows.last[rows], positions, new_slots, table, seq_lens, lora, dense)
        nxt, logprobs = self._sample(reqs, self.model.forward(batch))
        self.rows.lens[rows], self.rows.last[rows] = seq_lens, nxt
        return nxt.tolist(), logprobs

    @torch.inference_mode()
    def _mixed(self, items: list) -> tuple[list[int | None], list[TokenLogprob | None]]:
        """Chunks (first in `items`) and decodes in one pass; a step without chunks is a decode step."""
        chunks = [x for x in items if isinstance(x, Chunk)]
        decodes = [x for x in items if not isinstance(x, Chunk)]
        if not chunks:
            return self._decode(decodes)
        reqs = [c.req for c in chunks] + decodes
        sampled = [*(i for i, c in enumerate(chunks) if c.completes), *range(len(chunks), len(items))]
        batch, after = self._mixed_batch(chunks, decodes, sampled)
        logits = self.model.forward(batch)
        if sampled:
            nxt, logprobs = self._sample([reqs[i] for i in sampled], logits[after.sampled])
        else:
            nxt, logprobs = after.sampled, []  # no row to sample: empty
        self.rows.lens[after.rows], self.rows.last[after.last_rows] = after.lens, nxt
        self.rows.adapter[after.chunk_rows] = after.chunk_adapters
        for c in chunks:
            if c.completes:
                self._prefilling.pop(c.req.rid, None)
            else:
                self._prefilling[c.req.rid] = c.start + c.length
        tokens: list[int | None] = [None] * len(items)
        logprobs_of: list[TokenLogprob | None] = [None] * len(items)
        for i, t, lp in zip(sampled, nxt.tolist(), logprobs):
            tokens[i], logprobs_of[i] = t, lp
        return tokens, logprobs_of

    def _mixed_batch(self, chunks: list[Chunk], decodes: list[Request], sampled: list[int]) -> tuple[Mixed, "_After"]:
        """The pass's batch (each chunk's context so far written into its row of the slot table, each decode's
        new slot into its), and what the step changes in the rows once it has run."""
        self._prefill_ids([c.req for c in chunks if c.req.prompt_ids is None])  # a length only: draw its ids
        reqs = [c.req for c in chunks]
        starts, ends = [c.start for c in chunks], [c.start + c.length for c in chunks]
        rows = self.rows.add([r.rid for r in reqs], max(r.prompt_len + r.max_new_tokens for r in reqs))
        adapters = [self._adapter_of(r) for r in reqs]
        decode_rows = [self.rows.row_of[r.rid] for r in decodes]
        n_ctx, n_new, b, d, s = sum(ends), sum(ends) - sum(starts), len(chunks), len(decodes), len(sampled)
        host = torch.tensor(
            [
                *chain.from_iterable(r.kv_slots[:e] for r, e in zip(reqs, ends)),
                *chain.from_iterable(r.token_ids()[c.start : e] for r, c, e in zip(reqs, chunks, ends)),
                0,
                *accumulate(c.length for c in chunks),
                0,
                *accumulate(ends),
                *rows,
                *adapters,
                *ends,
                *starts,
                *decode_rows,
                *(r.kv_slots[r.held_tokens - 1] for r in decodes),
                *sampled,
                *((rows + decode_rows)[i] for i in sampled),
            ]
        )
        ctx_slots, new_ids, cu_t, cu_ctx, rows_t, adapter_t, ends_t, starts_t, rows_d, slots_d, sampled_t, last_rows = (
            host.to(self.device).split([n_ctx, n_new, b + 1, b + 1, b, b, b, b, d, d, s, s])
        )
        # each chunk's context so far, [0, end), into its row; its new tokens sit at positions start .. end - 1
        ctx_positions = torch.arange(n_ctx, device=self.device) - torch.repeat_interleave(
            cu_ctx[:-1], ends_t, output_size=n_ctx
        )
        self.rows.table[torch.repeat_interleave(rows_t, ends_t, output_size=n_ctx), ctx_positions] = ctx_slots
        new_t = ends_t - starts_t
        positions = torch.arange(n_new, device=self.device) - torch.repeat_interleave(
            cu_t[:-1] - starts_t, new_t, output_size=n_new
        )
        slots = self.rows.table[torch.repeat_interleave(rows_t, new_t, output_size=n_new), positions]
        positions_d = self.rows.lens[rows_d]  # the decodes, as a decode step takes them
        self.rows.table[rows_d, positions_d] = slots_d
        max_len = max((r.held_tokens for r in decodes), default=0)
        tokens = torch.cat([new_ids, self.rows.last[rows_d]])
        positions, slots = torch.cat([positions, positions_d]), torch.cat([slots, slots_d])
        chunk_lora = self.resident.batch(adapter_t) if max(adapters) >= 0 else None
        adapted_decodes = any(self._adapter_of(r) >= 0 for r in decodes)
        decode_lora = self.resident.batch(self.rows.adapter[rows_d]) if adapted_decodes else None
        prefix = CachedPrefix(self.rows.table[rows_t, : max(ends)], starts_t)
        n = n_new
        chunk_part = Prefill(
            tokens[:n], positions[:n], slots[:n], cu_t, max(c.length for c in chunks), chunk_lora, prefix
        )
        dense = self._dense(decodes, max_len) if decodes else None
        table_d = self.rows.table[rows_d, :max_len]
        decode_part = Decode(tokens[n:], positions[n:], slots[n:], table_d, positions_d + 1, decode_lora, dense)
        after = _After(
            torch.cat([rows_t, rows_d]), torch.cat([ends_t, positions_d + 1]), rows_t, adapter_t, sampled_t, last_rows
        )
        return Mixed(tokens, positions, slots, chunk_part, decode_part), after

    # -- helpers --------------------------------------------------------------------------
    def _sample(self, reqs: list[Request], logits: torch.Tensor) -> tuple[torch.Tensor, list[TokenLogprob | None]]:
        if self.on_logits is not None:
            self.on_logits(reqs, logits)
        return self.sampler.sample(reqs, logits)

    def _dense(self, reqs: list[Request], max_len: int):
        """This step's dense K/V of the batch (model/batch_kv.py), None where the kernels read the pool."""
        if self.batch_kv is None:
            return None
        capacity = max(max_len, max(r.prompt_len + r.max_new_tokens for r in reqs))  # its longest by its end
        return self.batch_kv.view([r.rid for r in reqs], capacity)

    def _invalidate_dense(self) -> None:
        if self.batch_kv is not None:
            self.batch_kv.invalidate()

    def _adapter_of(self, req: Request) -> int:
        return -1 if req.adapter is None else self.resident.index.get(req.adapter, -1)

    def _prefill_ids(self, reqs: list[Request]) -> list:
        """Each request's prefill ids (prompt, then its outputs after a preemption). A request given only a
        length gets random ids after a BOS, kept on it so that a prefill after a preemption sees the same prompt."""
        lengths = [r.prompt_len for r in reqs if r.prompt_ids is None]
        if lengths:
            low = min(FIRST_DUMMY_TOKEN, self.spec.vocab_size - 1)
            drawn = torch.randint(
                low, self.spec.vocab_size, (sum(lengths),), generator=self._gen, device=self.device
            ).tolist()
            for r, start in zip((r for r in reqs if r.prompt_ids is None), accumulate([0, *lengths])):
                r.prompt_ids = [self.spec.bos_token_id, *drawn[start + 1 : start + r.prompt_len]]
        return [r.token_ids() for r in reqs]

    def _bad_chunk(self, chunk: Chunk) -> bool:
        """A chunk the model cannot run: empty, past the prefill, not where the request's last chunk ended (or
        its cached length, for a first chunk), or a prefill the model cannot run."""
        req, end = chunk.req, chunk.start + chunk.length
        expected = self._prefilling.get(req.rid, req.cached_len)
        return chunk.length <= 0 or chunk.start != expected or end > req.prefill_len or self._bad_prompt(req, end)

    def _bad_decode(self, req: Request) -> bool:
        """A decode in a mixed step of a request that has no row, has not finished its prefill, or has no slot for
        its new token."""
        return req.rid not in self.rows.row_of or req.rid in self._prefilling or len(req.kv_slots) < req.held_tokens

    def _bad_prompt(self, req: Request, slots_needed: int) -> bool:
        """A prefill the model cannot run (caught here: on a GPU a bad index would kill the process)."""
        if req.prompt_len <= 0 or len(req.kv_slots) < slots_needed or not 0 <= req.cached_len < req.prefill_len:
            return True
        if len(req.output_ids) != req.generated:  # a re-prefill needs every generated id
            return True
        ids = req.prompt_ids
        if ids is not None and len(ids) != req.prompt_len:
            return True
        return any(
            len(part) and (min(part) < 0 or max(part) >= self.spec.vocab_size)
            for part in (ids, req.output_ids)
            if part is not None
        )

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def warmup(self) -> None:
        """Run every kernel once (Triton compiles on first use) on pool slots no request holds yet.

        Two 8-token prompts (one with a rank-8 attention+MLP adapter), the first one's last 4 tokens again
        over its cached first 4 (an extend), then one decode step.
        """
        spec, pool, dev = self.spec, self.model.pool, self.device
        adapter = AdapterSpec("warmup", WARMUP_RANK, float(WARMUP_RANK), TARGETS)
        n, lora_n = 16, adapter.slots(spec)
        if pool.num_slots < n + lora_n:
            return
        warm = AdapterRows(spec, dev)
        lora_slots = torch.arange(n, n + lora_n, device=dev)
        write_adapter(pool, lora_slots, dummy_adapter(spec, adapter, dev, pool.k.dtype), spec)
        warm.put(adapter, lora_slots)
        lora = warm.batch(torch.tensor([0, -1], device=dev))
        slots = torch.arange(n, device=dev)
        positions = torch.arange(n, device=dev) % 8
        tokens = torch.full((n,), spec.bos_token_id, device=dev)
        self.model.forward(Prefill(tokens, positions, slots, torch.tensor([0, 8, n], device=dev), 8, lora))
        table = slots.view(2, 8)
        prefix = CachedPrefix(table[:1], torch.tensor([4], device=dev))
        self.model.forward(
            Prefill(
                tokens[:4],
                positions[4:8],
                slots[4:8],
                torch.tensor([0, 4], device=dev),
                4,
                warm.batch(lora.ids[:1]),
                prefix,
            )
        )
        self.model.forward(
            Decode(
                tokens[:2], torch.full((2,), 7, device=dev), table[:, -1], table, torch.full((2,), 8, device=dev), lora
            )
        )
        self._sync()


def resolve_device(backend: str, device: str | None) -> torch.device:
    """The default: cuda for triton (cpu only under TRITON_INTERPRET=1, the Triton interpreter), cpu for torch."""
    if device is None and backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        if not torch.cuda.is_available():
            raise UserError("--backend triton needs a CUDA GPU and none is available (--backend torch runs on the CPU)")
        device = "cuda"
    device = device or "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA GPU is available")
    try:
        return torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown device '{device}'") from None


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype '{dtype}' (known: float32, float16, bfloat16)")
    if DTYPES[dtype] is torch.float16 and device.type == "cpu":
        raise UserError("float16 is not supported on the CPU (use float32 or bfloat16)")
    return DTYPES[dtype]


def build_backend(
    name: str,
    model: str = "tiny",
    pool_tokens: int = 10_000,
    adapters: AdapterTable = AdapterTable(),
    device: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
    sampling: SamplingParams = SamplingParams(),
) -> LlamaBackend:
    """A real backend (`torch`: torch ops, `triton`: Triton kernels) for a spec name or model folder."""
    if name not in BACKEND_OPS:
        raise UserError(f"unknown real backend '{name}' (known: {', '.join(BACKEND_OPS)})")
    spec = resolve_spec(model)
    adapters.check_fits(spec, pool_tokens)
    dev = resolve_device(name, device)  # before the kernels are imported: they may turn on the interpreter
    dt = resolve_dtype(dtype, dev)
    ops = load_ops(BACKEND_OPS[name])
    if dev.type == "cpu" and spec.hidden_size <= SMALL_HIDDEN and "OMP_NUM_THREADS" not in os.environ:
        # A small model's ops are too short to split across threads: that only adds barrier waits
        # (10x slower steps on a busy 2-vCPU machine). OMP_NUM_THREADS overrides this.
        torch.set_num_threads(1)
    weights = load_weights(model, spec, dev, dt, seed)
    if can_pack(dev, dt):  # oneDNN's matmul on prepacked weights (model/linear.py)
        weights = packed_weights(weights)
    llama = Llama(spec, weights, KVPool(spec, pool_tokens, dev, dt), ops)
    return LlamaBackend(llama, sampling, adapters, seed)
