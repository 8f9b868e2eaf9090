"""Hypothesis strategies of workloads the tests share (apart from tests/helpers/engine.py, which
tests/vllm imports in a venv without hypothesis)."""

import random

from hypothesis import strategies as st

from slora_vtc.request import Request

PREFIXES = [list(range(1000 * k, 1000 * k + 200)) for k in range(1, 4)]  # shared prompt starts


@st.composite
def two_backlogged_clients(draw, fewest: int = 5, most: int = 60, longest: int = 200, adapters: bool = False):
    """Clients a and b with `fewest`..`most` requests each, drawn from length ranges of its own (so
    that the two differ in shape), all sent at t = 0, in a drawn order; with `adapters`, each
    client's requests use its own adapter (named after it)."""
    requests = []
    for client in "ab":
        n = draw(st.integers(fewest, most))
        p_hi, o_hi = draw(st.integers(1, longest)), draw(st.integers(1, longest))
        lengths = st.lists(st.tuples(st.integers(1, p_hi), st.integers(1, o_hi)), min_size=n, max_size=n)
        adapter = client if adapters else None
        requests += [Request(client, p, o, 0.0, adapter=adapter) for p, o in draw(lengths)]
    return draw(st.permutations(requests))


@st.composite
def arrivals(draw) -> list[Request]:
    """1 to 30 requests of clients a to d arriving over 4 s, prompts of 1 to 300 tokens (a drawn
    part of each one of three shared starts, the prefix cache's hits), 1 to 120 new tokens."""
    shapes = draw(
        st.lists(
            st.tuples(
                st.floats(0, 4, allow_nan=False), st.integers(1, 300), st.integers(1, 120), st.sampled_from("abcd")
            ),
            min_size=1,
            max_size=30,
        )
    )
    rng = random.Random(draw(st.integers(0, 2**16)))
    requests = []
    for rid, (arrival, prompt, out, client) in enumerate(sorted(shapes)):
        shared = PREFIXES[rng.randrange(len(PREFIXES))][: rng.randrange(prompt + 1)]
        ids = shared + [rng.randrange(10**6, 2 * 10**6) for _ in range(prompt - len(shared))]
        requests.append(Request(client, prompt, out, arrival, rid=rid, prompt_ids=ids))
    return requests
