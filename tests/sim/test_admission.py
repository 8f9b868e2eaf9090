"""The admission check every scheduler shares (docs/design.md, "The memory pool and the admission
check"), against hand-computed cases."""

from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slora_vtc.config import EngineConfig
from slora_vtc.memory import Budget, fits_alone
from slora_vtc.memory.admission import peak_need
from tests.helpers.engine import config, req


def running(prompt, max_new, generated, adapter=None):
    r = req("r", prompt, max_new, adapter=adapter)
    r.generated = generated
    return r


def test_peak_need_by_hand():
    # cumulative held: 20, 50, 90 -> max(10*1 + 20, 5*2 + 50, 2*3 + 90) = 96
    assert peak_need([10, 5, 2], [20, 30, 40]) == 96
    # the first request dominates: 100*1 + 1 = 101 > 1*2 + 2
    assert peak_need([100, 1], [1, 1]) == 101
    assert peak_need([], []) == 0


# running (held 50 + 5 = 55, to generate 20 - 5 = 15); candidate (30 + 1 = 31, 41 - 1 = 40)
# sorted by to_generate: (40, 31), (15, 55) -> need = max(40 + 31, 15 * 2 + 86) = 116
@pytest.mark.parametrize("pool, admitted", [(117, True), (116, False), (200, True), (100, False)])
def test_candidate_with_running_request(pool, admitted):
    budget = Budget(config(pool), [running(50, 20, 5)])
    assert budget.try_add(req("c", 30, 41)) is admitted


def test_empty_engine_admits_exactly_below_the_pool():
    # alone: need = (max_new - 1) + prompt + 1 = prompt + max_new
    assert Budget(config(200), []).try_add(req("c", 100, 99))  # 199 < 200
    assert not Budget(config(200), []).try_add(req("c", 100, 100))  # 200 is not < 200


def test_candidates_accumulate_within_one_round():
    budget = Budget(config(200), [])
    # pairs are (held, to_generate); rows are to_generate * (i + 1) + cumulative held
    assert budget.try_add(req("c", 50, 51))  # (51, 50): 50 + 51 = 101
    assert budget.try_add(req("c", 40, 41))  # + (41, 40): max(101, 80 + 92) = 172
    assert budget.try_add(req("c", 10, 11))  # + (11, 10): max(101, 172, 30 + 103) = 172
    assert budget.try_add(req("c", 1, 31))  # + (2, 30) third: max(101, 172, 90 + 94, 40 + 105) = 184
    # + (2, 40): the third row becomes 40 * 3 + 94 = 214 >= 200
    assert not budget.try_add(req("c", 1, 41))
    # + (6, 5) last: max(101, 172, 184, 145, 25 + 111) = 184; the rejected one left no trace
    assert budget.try_add(req("c", 5, 6))


def test_adapter_slots_count_each_distinct_adapter():
    # need 116 as above; rank 2 -> 8 slots per adapter
    run = [running(50, 20, 5, adapter="A")]
    # same adapter: 8 slots -> admitted iff 116 < pool - 8
    assert Budget(config(125, lora_rank=2), run).try_add(req("c", 30, 41, adapter="A"))
    assert not Budget(config(124, lora_rank=2), run).try_add(req("c", 30, 41, adapter="A"))
    # a second adapter: 16 slots -> admitted iff 116 < pool - 16
    assert Budget(config(133, lora_rank=2), run).try_add(req("c", 30, 41, adapter="B"))
    assert not Budget(config(132, lora_rank=2), run).try_add(req("c", 30, 41, adapter="B"))


def test_adapters_of_different_sizes_count_each_at_its_own_size():
    # need 116 as above; A takes 8 slots (the rank-2 default), B 30 (say rank 8 with MLP targets)
    sizes = (("B", 30),)
    run = [running(50, 20, 5, adapter="A")]
    # A resident + B new: 116 < pool - 38 iff pool >= 155
    assert Budget(config(155, lora_rank=2, adapter_sizes=sizes), run).try_add(req("c", 30, 41, adapter="B"))
    assert not Budget(config(154, lora_rank=2, adapter_sizes=sizes), run).try_add(req("c", 30, 41, adapter="B"))
    # B resident, the candidate adds nothing new: 116 < pool - 30 iff pool >= 147
    run_b = [running(50, 20, 5, adapter="B")]
    assert Budget(config(147, lora_rank=2, adapter_sizes=sizes), run_b).try_add(req("c", 30, 41, adapter="B"))
    assert not Budget(config(146, lora_rank=2, adapter_sizes=sizes), run_b).try_add(req("c", 30, 41, adapter="B"))
    # alone in an empty engine: prompt + output < pool - its own adapter (10 + 159 < 200 - 30; 10 + 160 is not)
    assert fits_alone(req("c", 10, 159, adapter="B"), config(200, lora_rank=2, adapter_sizes=sizes))
    assert not fits_alone(req("c", 10, 160, adapter="B"), config(200, lora_rank=2, adapter_sizes=sizes))
    assert fits_alone(req("c", 10, 160, adapter="A"), config(200, lora_rank=2, adapter_sizes=sizes))


def test_adapter_of_an_earlier_candidate_is_counted():
    budget = Budget(config(30, lora_rank=2), [])
    assert budget.try_add(req("c", 5, 5, adapter="A"))  # need 10 < 30 - 8
    # (6, 4) + (6, 4): need max(4 + 6, 8 + 12) = 20; with a second adapter 20 < 30 - 16 fails
    assert not budget.try_add(req("c", 5, 5, adapter="B"))
    assert budget.try_add(req("c", 5, 5, adapter="A"))  # 20 < 30 - 8


def test_max_running_counts_running_and_candidates():
    budget = Budget(config(1000, max_running=3), [running(5, 5, 1), running(5, 5, 1)])
    assert budget.try_add(req("c", 5, 5))
    assert not budget.try_add(req("c", 5, 5))


def test_batch_max_tokens_limits_the_new_prompts_only():
    cfg = config(1000, batch_max_tokens_override=50)
    budget = Budget(cfg, [running(400, 5, 1)])  # running prompts do not count
    assert budget.try_add(req("c", 30, 2))
    assert budget.try_add(req("c", 20, 2))  # 50 <= 50
    assert not budget.try_add(req("c", 1, 2))


def test_batch_max_tokens_default():
    assert EngineConfig(pool_tokens=200).batch_max_tokens == 3072
    assert EngineConfig(pool_tokens=10_000).batch_max_tokens == 3072
    assert EngineConfig(pool_tokens=35_000).batch_max_tokens == 35_000 // 6
    budget = Budget(EngineConfig(pool_tokens=100_000, lora_rank=0), [])
    assert budget.try_add(req("c", 3000, 2))
    assert budget.try_add(req("c", 16_666 - 3000, 2))
    assert not budget.try_add(req("c", 1, 2))


def test_rejected_candidate_is_not_counted():
    budget = Budget(config(200), [])
    assert not budget.try_add(req("c", 150, 60))
    assert budget.try_add(req("c", 100, 99))  # as if the first had never been tried


def test_fits_alone():
    cfg = config(200, lora_rank=2)
    assert fits_alone(req("c", 100, 99), cfg)  # no adapter: 199 < 200
    assert not fits_alone(req("c", 100, 100), cfg)
    assert fits_alone(req("c", 100, 91, adapter="A"), cfg)  # 191 < 200 - 8
    assert not fits_alone(req("c", 100, 92, adapter="A"), cfg)
    big = config(100_000, batch_max_tokens_override=100)
    assert fits_alone(req("c", 100, 5), big)
    assert not fits_alone(req("c", 101, 5), big)


def brute_force_need(pairs):
    """pairs: (held, to_generate); docs/design.md's formula, written out plainly."""
    pairs = sorted(pairs, key=lambda p: -p[1])
    cum = list(accumulate(h for h, _ in pairs))
    return max(t * (i + 1) + cum[i] for i, (_, t) in enumerate(pairs))


pairs = st.tuples(st.integers(1, 60), st.integers(1, 60), st.integers(0, 59))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(pairs, max_size=6),
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=6),
    st.integers(50, 400),
)
def test_budget_matches_the_formula(run_specs, candidates, pool):
    runs = [running(p, m, min(g, m - 1) + 1 if m > 1 else 1) for p, m, g in run_specs]
    runs = [r for r in runs if r.generated < r.max_new_tokens]
    budget = Budget(config(pool), runs)
    admitted = [(r.prompt_len + r.generated, r.max_new_tokens - r.generated) for r in runs]
    for prompt, max_new in candidates:
        trial = admitted + [(prompt + 1, max_new - 1)]
        expected = brute_force_need(trial) < pool
        assert budget.try_add(req("c", prompt, max_new)) is expected
        if expected:
            admitted = trial
