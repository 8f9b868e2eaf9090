"""Hypothesis strategies of workloads the tests share (apart from tests/helpers/engine.py, which
tests/vllm imports in a venv without hypothesis)."""

from hypothesis import strategies as st

from slora_vtc.request import Request


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
