"""The paper's uniform workloads draw without numpy exactly what numpy's RandomState draws."""

import numpy as np
import pytest

from slora_vtc.errors import UserError
from slora_vtc.suites import SUITES, get_suite
from slora_vtc.suites.paper import ON_OFF_PERIOD_S, legacy_random

SEEDS = [0, 1, 42, 7_777, 2**31, 2**32 - 1]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_stream_is_randomstates_rand_bit_for_bit(seed):
    ours, theirs = legacy_random(seed), np.random.RandomState(seed)
    assert [ours.random() for _ in range(2000)] == theirs.rand(2000).tolist()  # past the first state regeneration


@pytest.mark.parametrize("seed", SEEDS)
def test_an_exact_randint_draws_nothing(seed):
    """Why the uniform suites need no randint: numpy's randint(L, L + 1) leaves the stream as it is."""
    drawn = np.random.RandomState(seed)
    drawn.randint(256, 257, 900)
    assert drawn.rand() == np.random.RandomState(seed).rand()


def numpy_uniform_client(rng, client, rate, duration, lengths, start=0.0, on_off=False):
    """The artifact's draws as numpy makes them (the generator before it stopped importing numpy)."""
    n = int(rate * duration)
    inputs, outputs = rng.randint(lengths[0], lengths[0] + 1, n), rng.randint(lengths[1], lengths[1] + 1, n)
    times = np.add.accumulate(np.concatenate([[start + rng.rand() / rate], np.full(n, 1.0 / rate)]))[1:]
    keep = (times // ON_OFF_PERIOD_S).astype(int) % 2 == 0 if on_off else np.ones(n, bool)
    return [(client, int(i), int(o), float(t)) for i, o, t, k in zip(inputs, outputs, times, keep) if k]


def numpy_specs(suite: str, duration: float, seed: int) -> list[tuple]:
    rng = np.random.RandomState(seed)
    if suite == "dist_shift":  # three phases: (client 0's rate, client 1's, client 0 on/off)
        span, specs = duration / 3, []
        for p, (r0, r1, on_off) in enumerate(((0.5, 2.0, True), (1.0, 1.0, False), (0.5, 1.5, False))):
            specs += numpy_uniform_client(rng, "client0", r0, span, (256, 256), p * span, on_off)
            specs += numpy_uniform_client(rng, "client1", r1, span, (256, 256), p * span)
        return specs
    rates = {"overload": (1.5, 3.0), "on_off_overload": (2.0, 3.0), "overload_multi": (0.4,) * 3 + (0.6,) * 5}[suite]
    lengths = (256, 256)
    return [
        spec
        for i, rate in enumerate(rates)
        for spec in numpy_uniform_client(
            rng, f"client{i}", rate, duration, lengths, on_off=suite.startswith("on_off") and i == 0
        )
    ]


@pytest.mark.parametrize("suite", ["overload", "on_off_overload", "overload_multi", "dist_shift"])
@pytest.mark.parametrize("seed", [42, 3, 2**32 - 1])
def test_uniform_suites_match_numpys_draws(suite, seed):
    duration = SUITES[suite].duration
    workload = get_suite(suite).workload(duration, seed)
    assert [(s.client, s.prompt_len, s.output_len, s.arrival) for s in workload.specs] == numpy_specs(
        suite, duration, seed
    )


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_numpy_cannot_take_is_refused(seed):
    with pytest.raises(UserError, match="seed"):
        get_suite("overload").workload(60, seed)
