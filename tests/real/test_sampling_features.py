"""Per-request sampling features of the real backend: penalties (against transformers' processor and
by hand), raw logprobs (against a transformers model), per-request seeds (alone, batched, preempted),
and the extreme values a request may give (against the limit worked out by brute force in float64)."""

from fractions import Fraction

import pytest
import torch

from slora_vtc.errors import UserError
from slora_vtc.model.sampler import BatchSampler
from slora_vtc.model.sampling import SamplingParams, apply_penalties, sample
from slora_vtc.request import Request, State
from tests.helpers.llama import hf_logits, record_logits, request, run_real, save_hf_llama, tiny_backend

PROMPTS = [[1, 5, 6, 7, 5, 9], [1, 9, 9, 4], [1, 4, 30, 31, 32, 33, 34, 35], [1, 17]]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    path = tmp_path_factory.mktemp("sampling") / "model"
    return path, save_hf_llama(path)


def run(backend, samplings, new: int = 8, pool: int = 400, prompts=PROMPTS, **config):
    reqs = [request(p, new, client="ab"[i % 2]) for i, p in enumerate(prompts)]
    for r, s in zip(reqs, samplings):
        r.sampling = s
    run_real(backend, reqs, pool, "vtc", clients=("a", "b"), **config)  # every request finishes, the pool is free
    assert all(r.generated == new for r in reqs)
    return reqs


# -- validation ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(presence_penalty=-2.01), "presence_penalty"),
        (dict(frequency_penalty=3), "frequency_penalty"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(logprobs=21), "logprobs"),
        (dict(logprobs=-1), "logprobs"),
        (dict(logprobs=True), "logprobs"),
        (dict(seed=1.5), "seed"),
        (dict(seed="7"), "seed"),
        (dict(temperature=float("inf")), "temperature"),
    ],
)
def test_bad_values_raise_a_user_error_naming_the_field(bad, field):
    with pytest.raises(UserError, match=field):
        SamplingParams(**bad)


def test_edge_values_are_accepted():
    for ok in (
        dict(presence_penalty=-2, frequency_penalty=2),
        dict(repetition_penalty=1e-3),
        dict(logprobs=0),
        dict(logprobs=20),
        dict(seed=-1),
        dict(seed=2**70),
    ):
        SamplingParams(**ok)
    assert SamplingParams(seed=5).greedy and not SamplingParams(temperature=0.1).greedy


# -- penalties -------------------------------------------------------------------------------------------
def test_presence_and_frequency_penalties_by_hand():
    # prompt [0, 4], output [3, 3, 1]: presence and frequency count only the output; repetition both
    logits = torch.tensor([[1.0, 2.0, 0.5, 3.0, -1.0]])
    output = torch.tensor([[0, 1, 0, 2, 0]])
    prompt = torch.tensor([[True, False, False, False, True]])
    got = apply_penalties(logits, output, prompt, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    # token 1: 2 - 0.25 * 1 - 0.5; token 3: 3 - 0.25 * 2 - 0.5; the prompt's tokens 0 and 4 untouched
    assert got.tolist() == [[1.0, 1.25, 0.5, 2.0, -1.0]]
    got = apply_penalties(
        logits, output, prompt, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    )
    # repetition first (positive / 2, negative * 2, prompt and output), then frequency and presence
    assert got.tolist() == [[0.5, 0.25, 0.5, 0.5, -2.0]]


def test_the_sampler_counts_each_requests_output_as_it_grows():
    """Greedy with a frequency penalty on fixed logits: each pick lowers that token by 0.5, so the picks go
    as worked by hand."""
    sampler = BatchSampler(SamplingParams(), torch.Generator(), 4, torch.device("cpu"))
    req = Request("a", 2, 7, 0.0, rid=0, prompt_ids=[3, 3], sampling=SamplingParams(frequency_penalty=0.5))
    logits = torch.tensor([[2.25, 1.5, 0.0, 4.0]])
    picks = []
    for _ in range(7):
        nxt, _ = sampler.sample([req], logits)
        req.append_token(int(nxt[0]), 0.0)
        picks.append(int(nxt[0]))
    # token 3 goes 4.0, 3.5, 3.0, 2.5, 2.0 (the prompt's two 3s do not count); 0 (2.25) wins, then 3
    # (2.0 > 1.75), then 0 (1.75 > 1.5)
    assert picks == [3, 3, 3, 3, 0, 3, 0]
    sampler.release(req)
    assert not sampler._seen


def test_repetition_penalty_equals_transformers_processor(hf):
    """Greedy with penalties through the engine: every pick is the argmax of transformers'
    RepetitionPenaltyLogitsProcessor over the recorded raw logits and the ids so far."""
    from transformers import RepetitionPenaltyLogitsProcessor

    folder, _ = hf
    backend = tiny_backend(str(folder))
    logits = record_logits(backend)
    plain = run(tiny_backend(str(folder)), [SamplingParams()] * len(PROMPTS), new=12)
    reqs = run(backend, [SamplingParams(repetition_penalty=1.8)] * len(PROMPTS), new=12)
    processor = RepetitionPenaltyLogitsProcessor(1.8)
    for r in reqs:
        for step, row in enumerate(logits[r.rid]):
            ids = torch.tensor([r.prompt_ids + r.output_ids[:step]])
            assert int(processor(ids, row[None].clone()).argmax()) == r.output_ids[step]
    assert [r.output_ids for r in reqs] != [r.output_ids for r in plain]  # the penalty changed something


# -- logprobs ---------------------------------------------------------------------------------------------
def test_logprobs_are_log_softmax_of_the_models_logits(hf):
    """Logprobs are the raw ones: those of transformers' logits, unchanged by temperature or penalties."""
    folder, model = hf
    samplings = [
        SamplingParams(logprobs=5),
        SamplingParams(temperature=1.5, presence_penalty=1.0, repetition_penalty=1.3, seed=2, logprobs=3),
        SamplingParams(logprobs=0),
        None,
    ]
    reqs = run(tiny_backend(str(folder)), samplings)
    for r, s in zip(reqs, samplings):
        if s is None:
            assert r.output_logprobs == []
            continue
        assert len(r.output_logprobs) == len(r.output_ids)
        expected = hf_logits(model, r.prompt_ids + r.output_ids)[r.prompt_len - 1 : -1].log_softmax(-1)
        for tok, got, ref in zip(r.output_ids, r.output_logprobs, expected):
            assert got.logprob == pytest.approx(float(ref[tok]), abs=1e-4)
            assert len(got.top) == s.logprobs
            values, ids = ref.topk(s.logprobs)
            assert [i for i, _ in got.top] == ids.tolist()
            assert [v for _, v in got.top] == pytest.approx(values.tolist(), abs=1e-4)
            assert all(a[1] >= b[1] for a, b in zip(got.top, got.top[1:]))  # most likely first
            if got.top:
                assert got.logprob <= got.top[0][1] + 1e-6  # nothing beats the top one
            if s.greedy:
                assert got.top == () or got.top[0][0] == tok  # greedy without penalties picks the most likely


# -- seeds ---------------------------------------------------------------------------------------------------
SEEDED = [
    SamplingParams(temperature=3.0, seed=11),
    SamplingParams(temperature=3.0, top_k=50, seed=12),
    SamplingParams(temperature=3.0, top_p=0.9, seed=11, frequency_penalty=0.5),
    SamplingParams(temperature=3.0, seed=-7, logprobs=2),
]


def test_a_seeded_request_draws_the_same_tokens_alone_batched_and_preempted():
    new = 16
    alone = [run(tiny_backend(), [s], new=new, prompts=[p])[0].output_ids for s, p in zip(SEEDED, PROMPTS)]
    # batched, with an unseeded sampled request drawing from the shared generator in between
    mixed = run(tiny_backend(), [*SEEDED, SamplingParams(temperature=3.0)], new=new, prompts=[*PROMPTS, [1, 2, 3]])
    assert [r.output_ids for r in mixed[:4]] == alone
    # 4 x (4..8 + 16) tokens do not fit 60 at once: optimistic admission preempts and recomputes
    preempted = run(tiny_backend(pool=60), SEEDED, new=new, pool=60, admission="optimistic")
    assert sum(r.preemptions for r in preempted) > 0
    assert [r.output_ids for r in preempted] == alone
    assert len(preempted[3].output_logprobs) == new  # one per output id after a preemption too
    other = run(tiny_backend(), [SamplingParams(temperature=3.0, seed=99)], new=new, prompts=PROMPTS[:1])[0].output_ids
    assert other != alone[0]  # another seed draws otherwise


def test_penalised_greedy_requests_recover_their_counts_after_a_preemption():
    samplings = [
        SamplingParams(repetition_penalty=1.5),
        SamplingParams(presence_penalty=1.5, frequency_penalty=1.0),
        SamplingParams(frequency_penalty=2.0),
        SamplingParams(repetition_penalty=0.5, presence_penalty=-1.0),
    ]
    roomy = run(tiny_backend(), samplings, new=16)
    tight = run(tiny_backend(pool=60), samplings, new=16, pool=60, admission="optimistic")
    assert sum(r.preemptions for r in tight) > 0
    assert [r.output_ids for r in tight] == [r.output_ids for r in roomy]


def test_generators_and_counts_go_when_requests_end():
    backend = tiny_backend(pool=60)
    run(backend, SEEDED, new=16, pool=60, admission="optimistic")
    assert backend.sampler._generators == {} and backend.sampler._seen == {}


def test_a_preempted_request_keeps_its_generator_and_others_lose_theirs():
    """Released as preempted: the generator stays (its draws go on); released for good: it goes."""
    sampler = BatchSampler(SamplingParams(), torch.Generator(), 4, torch.device("cpu"))
    seeded = SamplingParams(temperature=1.0, seed=3)
    logits = torch.zeros((1, 4))
    preempted, aborted = (
        Request("a", 1, 10, 0.0, rid=rid, prompt_ids=[1], sampling=seeded, state=State.RUNNING) for rid in (0, 1)
    )
    for req in (preempted, aborted):
        sampler.sample([req], logits)
    generator = sampler._generators[0]
    sampler.release(preempted, preempted=True)
    sampler.release(aborted)
    assert sampler._generators == {0: generator}
    sampler.release(preempted)
    assert sampler._generators == {}


# -- extreme values: sampling tends to its limit, never fails ------------------------------------------
DENORMAL = 5e-324  # the smallest positive double
TINY_VALUES = (DENORMAL, 1e-320, 1e-310, 2.2250738585072014e-308, 1e-300, 1e-46, 1e-45, 1e-40, 1.1754944e-38, 1e-30)


def random_logits(rows: int = 6, vocab: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.rand((rows, vocab), generator=torch.Generator().manual_seed(seed)) * 6 - 3


def argmax_by_hand(rows: list[list[float]]) -> list[int]:
    return [max(range(len(row)), key=row.__getitem__) for row in rows]


def draws(logits: torch.Tensor, params: SamplingParams, times: int = 20, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [sample(logits, params, gen).tolist() for _ in range(times)]


@pytest.mark.parametrize("top_p", TINY_VALUES)
@pytest.mark.parametrize("temperature", (0.1, 1.0, 2.0))
def test_a_tiny_top_p_samples_the_most_likely_token(top_p, temperature):
    """top_p -> 0 keeps the single most likely token, denormal or not (5e-324 once failed: it rounds to 0 in
    float32, and the most likely token was dropped with the rest)."""
    logits = random_logits()
    expected = argmax_by_hand(logits.tolist())
    assert all(d == expected for d in draws(logits, SamplingParams(temperature=temperature, top_p=top_p)))


@pytest.mark.parametrize("temperature", TINY_VALUES)
def test_a_tiny_temperature_samples_the_most_likely_token(temperature):
    logits = random_logits()
    expected = argmax_by_hand(logits.tolist())
    assert all(d == expected for d in draws(logits, SamplingParams(temperature=temperature)))


@pytest.mark.parametrize("temperature", (DENORMAL, 1e-300, 1e-40))
def test_a_tiny_temperature_splits_evenly_between_tied_most_likely_tokens(temperature):
    """The limit of softmax(l / t) as t -> 0 is uniform over the tokens tied for the largest logit."""
    logits = torch.tensor([[1.0, 3.0, 3.0, -2.0, 2.999]])
    tokens = [d[0] for d in draws(logits, SamplingParams(temperature=temperature), times=200)]
    assert set(tokens) == {1, 2} and 60 < tokens.count(1) < 140  # binomial(200, 1/2): 60..140 is 5.6 sigma


@pytest.mark.parametrize("top_k", (40, 41, 2**63 - 1, 10**30))
def test_a_top_k_of_the_vocabulary_or_more_filters_nothing(top_k):
    logits = random_logits(vocab=40)
    assert draws(logits, SamplingParams(temperature=1.0, top_k=top_k)) == draws(logits, SamplingParams(temperature=1.0))


@pytest.mark.parametrize("penalty", (DENORMAL, 1e-300, 1e-40, 1e40, 1e300, 1.7976931348623157e308))
def test_an_extreme_repetition_penalty_samples_its_limit(penalty):
    """The repetition penalty divides a seen token's positive logit and multiplies a negative one: by brute force in
    exact fractions (nothing rounds to 0 or overflows), the most likely token at a tiny temperature is the argmax
    of the penalised logits; with temperature 1 the draws stay among the tokens whose weight is not 0 in float64."""
    logits = random_logits()
    seen = torch.rand(logits.shape, generator=torch.Generator().manual_seed(1)) < 0.3
    params = SamplingParams(repetition_penalty=penalty)
    penalised = apply_penalties(logits, torch.zeros_like(logits, dtype=torch.int32), seen, params)
    by_hand = [
        [
            (Fraction(x) / Fraction(penalty) if x > 0 else Fraction(x) * Fraction(penalty)) if s else Fraction(x)
            for x, s in zip(row, seen_row)
        ]
        for row, seen_row in zip(logits.tolist(), seen.tolist())
    ]
    expected = argmax_by_hand(by_hand)
    assert all(d == expected for d in draws(penalised, SamplingParams(temperature=1e-300)))
    possible = [{i for i, x in enumerate(row) if x - max(row) > -746} for row in by_hand]  # exp(-746) is 0
    for d in draws(penalised, SamplingParams(temperature=1.0), times=50):
        assert all(token in allowed for token, allowed in zip(d, possible))
