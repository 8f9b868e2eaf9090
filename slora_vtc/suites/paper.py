"""The paper's workload generators, drawing exactly as the artifact did (docs/design.md, "Workloads").

numpy's legacy generator is seeded at the start of each workload, rates are in requests per
second, and the draw order is the artifact's, so the overload suite's arrival times match the
artifact's measured runs to the bit.

The uniform suites draw only each client's phase (`rand()`: lengths are exact, and an exact
`randint(L, L + 1)` draws nothing), so they draw from `legacy_random(seed)`, the same MT19937
stream without importing numpy; the Poisson suites use numpy's RandomState itself.
"""

import random
from collections.abc import Callable

from slora_vtc.errors import UserError
from slora_vtc.suites.base import Generator
from slora_vtc.workload import RequestSpec, client_names

ON_OFF_PERIOD_S = 60.0
DIST_SHIFT_PHASES = ((0.5, 2.0, True), (1.0, 1.0, False), (0.5, 1.5, False))  # (rate0, rate1, client 0 on/off)
MT_STATE_WORDS = 624


def per_min(*rates: float) -> list[float]:
    return [r / 60.0 for r in rates]


def legacy_random(seed: int) -> random.Random:
    """numpy.random.RandomState(seed)'s stream, without numpy: numpy seeds its MT19937 with
    init_genrand (Python's random.seed would use init_by_array), and RandomState.rand() and
    random.random() are the same function of the stream (53 bits from two words), so
    `legacy_random(seed).random()` draws what `RandomState(seed).rand()` draws, bit for bit."""
    key = [_legacy_seed(seed)]
    for i in range(1, MT_STATE_WORDS):
        key.append((1812433253 * (key[-1] ^ (key[-1] >> 30)) + i) & 0xFFFFFFFF)
    rng = random.Random()
    rng.setstate((3, (*key, MT_STATE_WORDS), None))  # position 624: the next draw regenerates the state
    return rng


def _legacy_seed(seed: int) -> int:
    if not 0 <= seed < 2**32:
        raise UserError(f"the paper's workloads take a seed from 0 to 2**32 - 1 (numpy's legacy seeding), got {seed}")
    return seed


def _lengths(n: int, lengths: tuple[int, int]) -> tuple[list[int], list[int]]:
    """n input lengths then n output lengths: the artifact's randint(L, L + 1), exact and drawing nothing."""
    return [lengths[0]] * n, [lengths[1]] * n


def _uniform_client(rng: random.Random, client: str, rate: float, duration: float, lengths, start=0.0, on_off=False):
    n = int(rate * duration)
    inputs, outputs = _lengths(n, lengths)
    t, gap, times = start + rng.random() / rate, 1.0 / rate, []
    for _ in range(n):  # accumulated one gap at a time, as the artifact did, so times match its runs bit for bit
        t += gap
        times.append(t)
    keep = [int(t // ON_OFF_PERIOD_S) % 2 == 0 for t in times] if on_off else [True] * n
    return [RequestSpec(client, i, o, t) for i, o, t, k in zip(inputs, outputs, times, keep) if k]


def uniform(rates: list[float], lengths=(256, 256), on_off_first=False) -> Generator:
    """Every client sends every 1/rate s after a random phase; client 0 optionally on/off."""

    def generate(duration: float, seed: int) -> list[RequestSpec]:
        rng = legacy_random(seed)
        names = client_names(len(rates))
        return [
            spec
            for i, rate in enumerate(rates)
            for spec in _uniform_client(rng, names[i], rate, duration, lengths, on_off=on_off_first and i == 0)
        ]

    return generate


def poisson_short_long(rates: tuple[float, float], drawn: tuple[int, int], client0: Callable) -> Generator:
    """One merged Poisson stream (gamma gaps, cv = 1); client 0's lengths come from `client0`."""

    def generate(duration: float, seed: int) -> list[RequestSpec]:
        import numpy as np

        rng = np.random.RandomState(_legacy_seed(seed))
        total = rates[0] + rates[1]
        n = int(total * duration)
        is_client1 = rng.rand(n) > rates[0] / total
        inputs, outputs = _lengths(n, drawn)
        times = np.cumsum(rng.gamma(1.0, 1.0 / total, n))
        names = client_names(2)
        specs = []
        for c1, i, o, t in zip(is_client1, inputs, outputs, times):
            i, o = (int(i), int(o)) if c1 else client0(int(i), int(o))
            specs.append(RequestSpec(names[int(c1)], i, o, float(t)))
        return specs

    return generate


def increase(duration: float, seed: int) -> list[RequestSpec]:
    """Client 0 steady at 0.5 req/s; client 1 ramps linearly from 0.2 to 2 req/s."""
    names = client_names(2)  # (exact lengths only: nothing is drawn)
    n0, n1 = int(0.5 * duration), int(0.5 * (0.2 + 2) * duration)
    in0, out0 = _lengths(n0, (256, 256))
    in1, out1 = _lengths(n1, (256, 256))
    specs = [RequestSpec(names[0], int(i), int(o), (k + 1) / 0.5) for k, (i, o) in enumerate(zip(in0, out0))]
    t = 0.0
    for i, o in zip(in1, out1):
        t += 1.0 / (0.2 + 1.8 * t / duration)
        specs.append(RequestSpec(names[1], int(i), int(o), t))
    return specs


def dist_shift(duration: float, seed: int) -> list[RequestSpec]:
    """Three equal phases, each a uniform workload over its own span."""
    rng = legacy_random(seed)
    names = client_names(2)
    span = duration / len(DIST_SHIFT_PHASES)
    specs = []
    for p, (r0, r1, on_off) in enumerate(DIST_SHIFT_PHASES):
        specs += _uniform_client(rng, names[0], r0, span, (256, 256), start=p * span, on_off=on_off)
        specs += _uniform_client(rng, names[1], r1, span, (256, 256), start=p * span)
    return specs
