"""The real backend's mixed steps (chunked batching), against transformers (and peft).

A prompt computed in chunks over several steps, while other requests decode in the same forward passes:
the logits at each chunk's last position and at every decode equal transformers' full forward pass on the
same tokens, with and without a LoRA adapter (peft's), cold or on a cached prefix. A request served by
chunks draws the same tokens as one served by one prefill (seeded sampling, a prompt given as a length).
A chunk or decode the model cannot run fails alone. The backend is driven directly; slots come by hand
from a shuffled pool, by blocks (a request may hold more slots than it has computed tokens).
"""

import os
import random

import numpy as np
import pytest
import torch

from slora_vtc.backends.base import Chunk
from slora_vtc.backends.llama import build_backend
from slora_vtc.model.adapters import adapter_table
from slora_vtc.model.llama import Mixed
from slora_vtc.model.sampling import SamplingParams
from tests.helpers.llama import (
    hf_logits,
    record_logits,
    request,
    save_hf_llama_and_adapter,
    tiny_backend,
)

peft = pytest.importorskip("peft")

POOL = 600
BLOCK = 8  # slots are handed out by blocks of this many
ATOL = 1e-4
rng = random.Random(11)
LONG = [1, *(rng.randrange(3, 128) for _ in range(23))]  # 24 tokens: the prompt served by chunks
OTHER = [1, *(rng.randrange(3, 128) for _ in range(12))]
THIRD = [1, *(rng.randrange(3, 128) for _ in range(8))]
FOURTH = [1, *(rng.randrange(3, 128) for _ in range(11))]
BACKENDS = [
    "torch",
    pytest.param(  # the Triton kernels in the interpreter: about 8 s
        "triton",
        marks=pytest.mark.skipif(
            os.environ.get("TRITON_INTERPRET") != "1", reason="the fp32 check runs the kernels in the interpreter"
        ),
    ),
]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A tiny transformers Llama, and a PEFT adapter (rank 8, every target, random A and B) on a copy of it."""
    return save_hf_llama_and_adapter(tmp_path_factory.mktemp("mixed"), seed=4)


class Driver:
    """A backend with the r8 adapter loaded, a shuffled slot source handing out blocks, and a record of every
    forward pass's batch and logits."""

    def __init__(self, root, backend: str = "torch", seed: int = 0):
        adapters = adapter_table([f"r8={root / 'r8'}"])
        if backend == "torch":
            self.backend = tiny_backend(str(root / "base"), pool=POOL, adapters=adapters, seed=seed)
        else:  # the Triton kernels in the interpreter, on the CPU
            self.backend = build_backend(
                backend,
                str(root / "base"),
                pool_tokens=POOL,
                adapters=adapters,
                device="cpu",
                dtype="float32",
                seed=seed,
            )
        self.free = list(range(POOL))
        random.Random(0).shuffle(self.free)
        spec = self.backend.adapters.get("r8")
        self.backend.load_adapter("r8", np.array(self.take(spec.slots(self.backend.spec))))
        self.logits = record_logits(self.backend)  # rid -> the rows each sampled token came from
        self.passes: list[tuple[object, torch.Tensor]] = []
        forward = self.backend.model.forward
        self.backend.model.forward = lambda batch: self._record(batch, forward(batch))
        self.rids = iter(range(1000))

    def _record(self, batch, logits):
        self.passes.append((batch, logits.clone()))
        return logits

    def take(self, n: int) -> list[int]:
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def hold(self, r, tokens: int) -> None:
        """Blocks for the request's first `tokens` positions (its last block only partly used)."""
        while len(r.kv_slots) < tokens:
            r.kv_slots.extend(self.take(BLOCK))

    def new(self, prompt, new_tokens, adapter=None, cached_from=None, cached_len=0, **kw):
        r = request(prompt, new_tokens, adapter=adapter)
        r.rid = next(self.rids)
        for key, value in kw.items():
            setattr(r, key, value)
        r.kv_slots = list(cached_from.kv_slots[:cached_len]) if cached_from is not None else []
        r.cached_len = cached_len
        return r

    def prefill(self, reqs) -> None:
        for r in reqs:
            self.hold(r, r.prefill_len)
        self._apply(reqs, self.backend.prefill(reqs))

    def mixed(self, chunks: list[tuple[object, int, int]], decodes) -> list:
        """One mixed step: (request, start, end) chunks, then decodes; returns the step's tokens."""
        for r, _, end in chunks:
            self.hold(r, end)
        for r in decodes:
            self.hold(r, r.held_tokens)
        result = self.backend.mixed([Chunk(r, s, e - s) for r, s, e in chunks], decodes)
        assert result.failed == ()
        self._apply([r for r, *_ in chunks] + list(decodes), result)
        return result.tokens

    @staticmethod
    def _apply(reqs, result) -> None:
        """What the engine does: each request whose prefill is complete takes its token."""
        for r, token in zip(reqs, result.tokens):
            if token is not None:
                r.append_token(token, 0.0)

    def assert_matches(self, model, r) -> None:
        """Every sampled row of this request (its prefill's and its decodes') equals the model's on prompt +
        outputs."""
        expected = hf_logits(model, r.token_ids())[r.prompt_len - 1 : -1]
        torch.testing.assert_close(torch.stack(self.logits[r.rid]), expected, atol=ATOL, rtol=ATOL)


def chunk_rows(d: Driver) -> list[torch.Tensor]:
    """The logits at every chunk's last position, over the mixed passes so far, in order."""
    return [row for batch, logits in d.passes if isinstance(batch, Mixed) for row in logits[: len(batch.chunks.last)]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunks_and_decodes_in_one_pass_match_transformers(hf, backend):
    """LONG (with the adapter) in three chunks while two requests (one with the adapter) decode, then a fourth
    request's two chunks beside them; every logits row against transformers or peft."""
    root, model, adapted = hf
    d = Driver(root, backend)
    b, c = d.new(OTHER, 8), d.new(THIRD, 8, adapter="r8")
    d.prefill([b, c])
    a, e = d.new(LONG, 5, adapter="r8"), d.new(FOURTH, 4)
    assert d.mixed([(a, 0, 10)], [b, c]) == [None, b.output_ids[-1], c.output_ids[-1]]
    assert d.mixed([(a, 10, 17)], [b, c])[0] is None
    tokens = d.mixed([(a, 17, 24), (e, 0, 5)], [b, c])
    assert tokens[0] == a.output_ids[0] and tokens[1] is None and a.generated == 1 and e.generated == 0
    d.mixed([(e, 5, 12)], [a, b, c])
    while not all(r.done for r in (a, b, c, e)):
        d.mixed([], [r for r in (a, b, c, e) if not r.done])  # no chunk: a decode step
    computed = [len(batch.tokens) for batch, _ in d.passes]
    assert computed[:5] == [len(OTHER) + len(THIRD), 10 + 2, 7 + 2, 7 + 5 + 2, 7 + 3]
    want_a, want_e = hf_logits(adapted, LONG), hf_logits(model, FOURTH)
    expected = [want_a[9], want_a[16], want_a[23], want_e[4], want_e[11]]
    torch.testing.assert_close(torch.stack(chunk_rows(d)), torch.stack(expected), atol=ATOL, rtol=ATOL)
    for r, m in ((a, adapted), (b, model), (c, adapted), (e, model)):
        assert len(d.logits[r.rid]) == r.max_new_tokens
        d.assert_matches(m, r)


def test_chunks_over_a_cached_prefix_match_transformers(hf):
    """A request whose first 9 tokens' K/V are another's slots computes the rest in two chunks from 9."""
    root, model, _ = hf
    d = Driver(root)
    first = d.new(LONG, 3)
    d.prefill([first])
    second = d.new(LONG[:9] + FOURTH, 3, cached_from=first, cached_len=9)
    d.mixed([(second, 9, 15)], [first])
    d.mixed([(second, 15, len(second.prompt_ids))], [first])
    while not all(r.done for r in (first, second)):
        d.mixed([], [r for r in (first, second) if not r.done])
    assert [len(batch.tokens) for batch, _ in d.passes][1:3] == [6 + 1, 6 + 1]
    want = hf_logits(model, second.prompt_ids)
    torch.testing.assert_close(torch.stack(chunk_rows(d)), want[[14, 20]], atol=ATOL, rtol=ATOL)
    for r in (first, second):
        d.assert_matches(model, r)


def serve(root, prompt, chunk_ends, sampling, prompt_as_length=False) -> tuple:
    """One request on a fresh backend (seed 3), its prefill in one pass (no chunk_ends) or in chunks ending
    at chunk_ends, then decoded to the end: its prompt ids, output ids and logprobs."""
    d = Driver(root, seed=3)
    r = d.new(prompt, 6, sampling=sampling)
    if prompt_as_length:
        r.prompt_ids = None
    if chunk_ends:
        for start, end in zip([0, *chunk_ends], chunk_ends):
            d.mixed([(r, start, end)], [])
    else:
        d.prefill([r])
    while not r.done:
        d.mixed([], [r])
    return r.prompt_ids, r.output_ids, [lp.logprob for lp in r.output_logprobs]


@pytest.mark.parametrize("prompt_as_length", [False, True], ids=["ids", "length"])
def test_a_request_served_by_chunks_draws_as_one_prefill_would(hf, prompt_as_length):
    """Seeded sampling (temperature 1, its own generator) and logprobs: the same prompt (drawn at the first
    chunk when given as a length), tokens and logprobs whether the prefill ran in one pass or in three."""
    root, _, _ = hf
    sampling = SamplingParams(temperature=1.0, seed=12, logprobs=1)
    whole = serve(root, LONG, [], sampling, prompt_as_length)
    chunked = serve(root, LONG, [5, 6, 24], sampling, prompt_as_length)
    assert whole[0] == chunked[0] and whole[1] == chunked[1]
    assert chunked[2] == pytest.approx(whole[2], abs=1e-4)
    assert len(set(whole[1])) > 1  # sampled, not a constant
    other_seed = serve(root, LONG, [5, 24], SamplingParams(temperature=1.0, seed=13), prompt_as_length)
    assert other_seed[1] != chunked[1]  # the seed matters: the equality above is not a coincidence


@pytest.mark.parametrize(
    "case", ["skips ahead", "past the prompt", "empty", "too few slots", "decode mid-prefill", "decode no row"]
)
def test_a_chunk_or_decode_the_model_cannot_run_fails_alone(hf, case):
    root, model, _ = hf
    d = Driver(root)
    ok, running = d.new(OTHER, 2), d.new(THIRD, 3)
    d.prefill([running])
    bad = d.new(LONG, 2)
    d.mixed([(bad, 0, 6)], [])
    chunks = [Chunk(ok, 0, len(OTHER))]
    decodes = [running]
    d.hold(ok, len(OTHER))
    d.hold(running, running.held_tokens)
    d.hold(bad, len(LONG))
    if case == "skips ahead":
        chunks.append(Chunk(bad, 7, 4))
    elif case == "past the prompt":
        chunks.append(Chunk(bad, 6, len(LONG)))
    elif case == "empty":
        chunks.append(Chunk(bad, 6, 0))
    elif case == "too few slots":
        bad.kv_slots = bad.kv_slots[:10]
        chunks.append(Chunk(bad, 6, 5))
    elif case == "decode mid-prefill":
        decodes.append(bad)
    else:
        decodes.append(d.new(FOURTH, 2, generated=1, output_ids=[5]))
        d.hold(decodes[-1], len(FOURTH) + 1)
    result = d.backend.mixed(chunks, decodes)
    bad_index = 2 if case.startswith("decode") else 1
    assert result.failed == (bad_index,)
    good = [i for i in range(len(result.tokens)) if i != bad_index]
    assert all(result.tokens[i] is not None for i in good)
    want = [hf_logits(model, OTHER)[-1], hf_logits(model, running.token_ids())[-1]]
    rows = [d.logits[ok.rid][0], d.logits[running.rid][-1]]
    torch.testing.assert_close(torch.stack(rows), torch.stack(want), atol=ATOL, rtol=ATOL)


def test_a_request_preempted_mid_prefill_starts_its_chunks_again(hf):
    """Released after two of its chunks (preempted), its next chunks start at 0 again (a chunk from where it was
    fails), and it ends as an uninterrupted run would."""
    root, model, _ = hf
    d = Driver(root)
    a, b = d.new(LONG, 4), d.new(OTHER, 6)
    d.prefill([b])
    d.mixed([(a, 0, 8)], [b])
    d.mixed([(a, 8, 16)], [b])
    d.backend.release(a, preempted=True)
    a.kv_slots = []
    d.hold(a, 24)
    assert d.backend.mixed([Chunk(a, 16, 8)], []).failed == (0,)
    d.mixed([(a, 0, 12)], [b])
    d.mixed([(a, 12, 24)], [b])
    while not all(r.done for r in (a, b)):
        d.mixed([], [r for r in (a, b) if not r.done])
    want = hf_logits(model, LONG)
    torch.testing.assert_close(torch.stack(chunk_rows(d)), want[[7, 15, 11, 23]], atol=ATOL, rtol=ATOL)
    for r in (a, b):
        d.assert_matches(model, r)


def test_a_request_preempted_while_decoding_is_recomputed_in_chunks(hf):
    """Preempted after 3 outputs, its prefill over prompt + outputs (27 positions) runs as two chunks (the last
    one yields its 4th output), and it ends with an uninterrupted run's logits."""
    root, model, _ = hf
    d = Driver(root)
    a, b = d.new(LONG, 7), d.new(OTHER, 9)
    d.prefill([a, b])
    d.mixed([], [a, b])
    d.mixed([], [a, b])
    d.backend.release(a, preempted=True)
    a.kv_slots = []
    assert a.prefill_len == len(LONG) + 3
    assert d.mixed([(a, 0, 20)], [b])[0] is None
    assert d.mixed([(a, 20, a.prefill_len)], [b])[0] == a.output_ids[3]
    while not all(r.done for r in (a, b)):
        d.mixed([], [r for r in (a, b) if not r.done])
    want = hf_logits(model, a.token_ids())
    torch.testing.assert_close(torch.stack(chunk_rows(d)), want[[19, 26]], atol=ATOL, rtol=ATOL)
    for r in (a, b):
        d.assert_matches(model, r)
