"""The real backend with a cached prefix and after a preemption, against transformers (and peft).

(a) A request whose first k tokens' K/V are another request's slots (cached_len = k) computes only
its other tokens, yet its prefill and every decode step give transformers' logits on its full prompt;
also in one batch with a cold request and an adapter request that reuses its own adapter's prefix.
(b) A request released mid-generation and prefilled again over its prompt and outputs (cold, or
reusing its prompt's slots) ends with the tokens of an uninterrupted greedy run.
The backend is driven directly; slots come by hand from a shuffled pool.
(c) `slora-vtc profile` writes prefix-hit points (timed prefills that compute only the extension),
and profiles without them still load.
"""

import json
import os
import random

import numpy as np
import pytest
import torch

from slora_vtc.backends.llama import build_backend
from slora_vtc.cli import main
from slora_vtc.data import A10G_PROFILE, data_file
from slora_vtc.errors import UserError
from slora_vtc.memory import MemoryManager, TokenPool
from slora_vtc.model.adapters import adapter_table
from slora_vtc.profile import PREFIX_HITS, PrefixHitPoint, load_prefix_hits, load_profile, save_profile
from slora_vtc.realrun import _measure_hit
from tests.helpers.llama import (
    hf_logits,
    record_logits,
    request,
    save_hf_llama_and_adapter,
    tiny_backend,
)

peft = pytest.importorskip("peft")

POOL = 800
ATOL = 1e-4
rng = random.Random(5)
PROMPT = [1, *(rng.randrange(3, 128) for _ in range(23))]  # 24 tokens
TAIL = [rng.randrange(3, 128) for _ in range(6)]
OTHER = [1, *(rng.randrange(3, 128) for _ in range(14))]
ADAPTER_PROMPT = [1, *(rng.randrange(3, 128) for _ in range(17))]
BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=[
            pytest.mark.slow,  # the Triton interpreter
            pytest.mark.skipif(
                os.environ.get("TRITON_INTERPRET") != "1", reason="the fp32 check runs the kernels in the interpreter"
            ),
        ],
    ),
]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """A tiny transformers Llama, and a PEFT adapter (rank 8, every target, random A and B) on a copy of it."""
    return save_hf_llama_and_adapter(tmp_path_factory.mktemp("prefix"), seed=3)


class Slots:
    """Fresh pool slots in a shuffled order (so that no request's slots are contiguous)."""

    def __init__(self, size: int, first: int = 0):
        self.free = list(range(first, size))
        random.Random(0).shuffle(self.free)

    def take(self, n: int) -> list[int]:
        taken, self.free = self.free[:n], self.free[n:]
        return taken


class Driver:
    """A backend, a slot source and a count of the tokens each forward pass computes."""

    def __init__(self, root, adapters=None, backend: str = "torch"):
        adapters = adapters or adapter_table()
        if backend == "torch":
            self.backend = tiny_backend(str(root / "base"), pool=POOL, adapters=adapters)
        else:  # the Triton kernels in the interpreter, on the CPU
            self.backend = build_backend(
                backend, str(root / "base"), pool_tokens=POOL, adapters=adapters, device="cpu", dtype="float32"
            )
        self.logits = record_logits(self.backend)
        self.slots = Slots(POOL)
        self.computed: list[int] = []
        forward = self.backend.model.forward
        self.backend.model.forward = lambda batch: (self.computed.append(len(batch.tokens)), forward(batch))[1]
        self.rids = iter(range(1000))

    def new(self, prompt, new_tokens, adapter=None, cached_from=None, cached_len=0):
        """A request holding fresh slots, or `cached_from`'s first cached_len slots and fresh ones after them."""
        r = request(prompt, new_tokens, adapter=adapter)
        r.rid = next(self.rids)
        reused = cached_from.kv_slots[:cached_len] if cached_from is not None else []
        r.kv_slots, r.cached_len = [*reused, *self.slots.take(len(prompt) - len(reused))], len(reused)
        return r

    def step(self, kind: str, reqs) -> None:
        if kind == "decode":
            for r in reqs:
                r.kv_slots.append(self.slots.take(1)[0])
        result = getattr(self.backend, kind)(reqs)
        assert result.failed == ()
        for r, token in zip(reqs, result.tokens):
            r.append_token(token, 0.0)

    def finish(self, reqs) -> None:
        while any(not r.done for r in reqs):
            self.step("decode", [r for r in reqs if not r.done])

    def assert_matches(self, model, r) -> None:
        """Every logits row this request got (its prefills' and decode steps') equals the model's on
        prompt + outputs."""
        expected = hf_logits(model, r.token_ids())[r.prompt_len - 1 : -1]
        torch.testing.assert_close(torch.stack(self.logits[r.rid]), expected, atol=ATOL, rtol=ATOL)


def hf_greedy(model, prompt, new: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(new):
        tokens.append(int(hf_logits(model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


# -- (a) a cached prefix ------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 7, 16, 19, 24])  # 24: the first request's whole prompt (a follow-up turn)
def test_a_request_on_a_cached_prefix_gets_a_cold_runs_logits(hf, k):
    root, model, _ = hf
    d = Driver(root)
    first = d.new(PROMPT, 6)
    d.step("prefill", [first])
    second = d.new(PROMPT[:k] + TAIL, 6, cached_from=first, cached_len=k)
    d.step("prefill", [second])
    assert d.computed == [len(PROMPT), len(TAIL)]  # only the tokens after the cached prefix ran
    d.finish([first, second])  # decoding together: the shared slots serve both
    for r in (first, second):
        d.assert_matches(model, r)


def test_an_identical_prompt_computes_only_its_last_token(hf):
    root, model, _ = hf
    d = Driver(root)
    first = d.new(PROMPT, 3)
    d.step("prefill", [first])
    second = d.new(PROMPT, 3, cached_from=first, cached_len=len(PROMPT) - 1)
    d.step("prefill", [second])
    assert d.computed == [len(PROMPT), 1]
    d.finish([first, second])
    assert second.output_ids == first.output_ids == hf_greedy(model, PROMPT, 3)
    d.assert_matches(model, second)


def test_the_cached_tokens_k_v_are_read_not_recomputed(hf):
    """The cached part's ids are never fed to the model: with other ids there, the request still continues
    the prefix whose K/V its slots hold."""
    root, model, _ = hf
    d = Driver(root)
    first = d.new(PROMPT, 1)
    d.step("prefill", [first])
    second = d.new([2] * 10 + TAIL, 4, cached_from=first, cached_len=10)
    d.step("prefill", [second])
    d.finish([second])
    want = hf_logits(model, PROMPT[:10] + TAIL + second.output_ids)[len(second.prompt_ids) - 1 : -1]
    torch.testing.assert_close(torch.stack(d.logits[second.rid]), want, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_batch_mixing_cached_cold_and_adapter_requests(hf, backend):
    root, model, adapted = hf
    d = Driver(root, adapter_table([f"r8={root / 'r8'}"]), backend)
    spec = d.backend.adapters.get("r8")
    d.backend.load_adapter("r8", np.array(d.slots.take(spec.slots(d.backend.spec))))
    base_first, adapter_first = d.new(PROMPT, 2), d.new(ADAPTER_PROMPT, 2, adapter="r8")
    d.step("prefill", [base_first, adapter_first])
    batch = [
        d.new(PROMPT[:19] + TAIL, 7, cached_from=base_first, cached_len=19),  # a mid-block prefix
        d.new(OTHER, 5),  # cold
        d.new(ADAPTER_PROMPT[:11] + TAIL[:3], 6, adapter="r8", cached_from=adapter_first, cached_len=11),
    ]  # its adapter's own prefix
    d.step("prefill", batch)
    assert d.computed[-1] == len(TAIL) + len(OTHER) + 3
    d.finish([base_first, adapter_first, *batch])
    for r in (base_first, *batch[:2]):
        d.assert_matches(model, r)
    for r in (adapter_first, batch[2]):
        d.assert_matches(adapted, r)


# -- (b) prefilled again after a preemption -----------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reuse_prompt", [False, True], ids=["cold", "prompt cached"])
def test_a_resumed_request_ends_as_an_uninterrupted_greedy_run(hf, reuse_prompt, backend):
    root, model, _ = hf
    d = Driver(root, backend=backend)
    victim, neighbour = d.new(PROMPT, 12), d.new(OTHER, 12)
    d.step("prefill", [victim, neighbour])
    for _ in range(4):
        d.step("decode", [victim, neighbour])
    d.backend.release(victim)  # preempted: its row goes; a newcomer takes it
    newcomer = d.new(TAIL, 9)
    d.step("prefill", [newcomer])
    d.step("decode", [neighbour, newcomer])
    assert victim.generated == 5
    kept = victim.kv_slots[: victim.prompt_len] if reuse_prompt else d.slots.take(victim.prompt_len)
    victim.kv_slots, victim.cached_len = (
        [*kept, *d.slots.take(victim.generated)],
        victim.prompt_len if reuse_prompt else 0,
    )
    d.step("prefill", [victim])  # over prompt + its 5 outputs; yields output 6
    assert d.computed[-1] == (5 if reuse_prompt else len(PROMPT) + 5)
    d.finish([victim, neighbour, newcomer])
    assert victim.output_ids == hf_greedy(model, PROMPT, 12)
    for r in (victim, neighbour, newcomer):
        d.assert_matches(model, r)


def test_a_prompt_given_as_a_length_keeps_its_drawn_ids_across_a_preemption(hf):
    root, model, _ = hf
    d = Driver(root)
    victim = d.new(PROMPT, 8)
    victim.prompt_ids = None  # only a length: the backend draws the ids
    d.step("prefill", [victim])
    drawn = list(victim.prompt_ids)
    assert len(drawn) == len(PROMPT) and drawn[0] == d.backend.spec.bos_token_id
    d.step("decode", [victim])
    d.backend.release(victim)
    victim.kv_slots = [*victim.kv_slots[:10], *d.slots.take(victim.prefill_len - 10)]
    victim.cached_len = 10
    d.step("prefill", [victim])
    assert list(victim.prompt_ids) == drawn
    d.finish([victim])
    assert victim.output_ids == hf_greedy(model, drawn, 8)


@pytest.mark.parametrize("case", ["all cached", "too few slots", "outputs missing"])
def test_a_prefill_the_model_cannot_run_fails_that_request_only(hf, case):
    root, _, _ = hf
    d = Driver(root)
    first = d.new(PROMPT, 2)
    d.step("prefill", [first])
    bad = d.new(PROMPT, 2, cached_from=first, cached_len=len(PROMPT) - 1)
    if case == "all cached":
        bad.cached_len = len(PROMPT)
    elif case == "too few slots":
        bad.kv_slots = bad.kv_slots[:-1]
    else:
        bad.generated = 1  # a re-prefill with no ids for its output
    good = d.new(OTHER, 2)
    result = d.backend.prefill([bad, good])
    assert result.failed == (0,) and result.tokens[1] is not None


# -- prefix-hit points in the cost profile ------------------------------------------------------
def test_the_profile_command_writes_prefix_hit_points(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert (
        main(
            [
                "profile",
                "--model",
                "tiny",
                "--pool-tokens",
                "400",
                "--inputs",
                "8,16",
                "--outputs",
                "1,2",
                "--cached-lens",
                "40,100",
                "--extend-lens",
                "8,30",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "prefix hits:" in capsys.readouterr().out
    hits = load_prefix_hits(out)
    assert [(h.cached_len, h.extend_len, h.batch_size) for h in hits] == [
        (40, 8, 8),
        (40, 30, 5),
        (100, 8, 3),
        (100, 30, 3),
    ]  # 400 // (c + e)
    assert all(h.prefill_s > 0 for h in hits)
    assert len(load_profile(out)) == 4  # the ordinary points read as before
    assert (
        main(
            [
                "profile",
                "--model",
                "tiny",
                "--pool-tokens",
                "300",
                "--inputs",
                "8",
                "--outputs",
                "1,2,3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert [(h.cached_len, h.extend_len, h.batch_size) for h in load_prefix_hits(out)] == [
        (256, 32, 1)
    ]  # of the default grid, only this fits
    assert (
        main(
            [
                "profile",
                "--model",
                "tiny",
                "--pool-tokens",
                "300",
                "--inputs",
                "8",
                "--outputs",
                "1,2,3",
                "--no-prefix-hits",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "prefix_hits" not in json.loads(out.read_text()) and load_prefix_hits(out) == []


def test_a_timed_prefix_hit_computes_only_the_extension(hf):
    root, _, _ = hf
    d = Driver(root)
    memory = MemoryManager(TokenPool(POOL), 0)
    seconds = _measure_hit(d.backend, memory, 20, 6, 3, [])
    assert d.computed == [3 * 26, 3 * 6, 3 * 6, 3 * 6]  # one cold prefill, then three timed extensions
    assert seconds > 0 and memory.pool.num_free == POOL and d.backend.rows.row_of == {}


def test_old_profiles_load_and_hits_round_trip(tmp_path):
    old = data_file(A10G_PROFILE)
    assert PREFIX_HITS not in json.loads(old.read_text())
    assert len(load_profile(old)) >= 3 and load_prefix_hits(old) == []
    points = load_profile(old)
    hits = [PrefixHitPoint(4, 256, 32, 0.0125), PrefixHitPoint(1, 1024, 128, 0.5)]
    save_profile(points, tmp_path / "p.json", hits)
    assert load_profile(tmp_path / "p.json") == points and load_prefix_hits(tmp_path / "p.json") == hits


@pytest.mark.parametrize(
    "hits, message",
    [
        ({"a": 1}, "'prefix_hits' must be a list"),
        ([[1, 256, 32]], "prefix_hits entry 1: expected [batch_size, cached_len, extend_len, prefill_s]"),
        ([[1, 256, 32, 0.1], [2, 256.5, 32, 0.1]], "prefix_hits entry 2: expected"),
        ([[1, 256, 32, "fast"]], "prefix_hits entry 1: expected"),
        ([[1, 0, 32, 0.1]], "prefix_hits entry 1: batch size and lengths must be positive"),
        ([[1, 256, 32, -0.1]], "prefix_hits entry 1: batch size and lengths must be positive, the time non-negative"),
    ],
)
def test_bad_prefix_hits_name_the_file_and_entry(tmp_path, hits, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**json.loads(data_file(A10G_PROFILE).read_text()), PREFIX_HITS: hits}))
    assert len(load_profile(path)) >= 3  # the ordinary points do not depend on them
    with pytest.raises(UserError) as error:
        load_prefix_hits(path)
    assert str(path) in str(error.value) and message in str(error.value)


def test_a_prefix_hit_point_that_does_not_fit_is_a_one_line_error(tmp_path, capsys):
    code = main(
        [
            "profile",
            "--model",
            "tiny",
            "--pool-tokens",
            "300",
            "--inputs",
            "8",
            "--outputs",
            "1,2,3",
            "--cached-lens",
            "280",
            "--extend-lens",
            "32",
            "--out",
            str(tmp_path / "p.json"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "prefix-hit point (cached 280, extend 32) does not fit" in err
