"""The real engine under optimistic admission and with the prefix cache: greedy tokens equal those
of a run with memory to spare and no cache (preempted requests are recomputed, cached prefixes reused)."""

import random

import pytest

from tests.helpers.llama import request, run_real, save_hf_llama, tiny_backend

NEW = 40
rng = random.Random(11)
SHARED = [1, *(rng.randrange(3, 128) for _ in range(29))]  # 30 tokens every prompt starts with
PROMPTS = [SHARED + [rng.randrange(3, 128) for _ in range(5 + 3 * i)] for i in range(6)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("preempt") / "model"
    save_hf_llama(path)
    return path


def serve(folder, pool: int, **config):
    backend = tiny_backend(str(folder), pool=pool)
    # the first request is prefilled alone; the others arrive during its first step and find its prompt cached
    requests = [request(p, NEW, client="ab"[i % 2], arrival=0.0 if i == 0 else 1e-9) for i, p in enumerate(PROMPTS)]
    run_real(backend, requests, pool, "vtc", clients=("a", "b"), **config)  # every request finishes, the pool is free
    assert all(r.generated == NEW for r in requests)
    return requests


def test_preempted_and_cached_requests_end_with_the_tokens_of_an_unhurried_run(folder):
    reference = serve(folder, 2000)
    assert sum(r.preemptions for r in reference) == 0
    # 6 x (35..50 + 40) tokens do not fit 300 at once; with the shared 30-token start cached, not 200
    for pool, config in (
        (300, dict(admission="optimistic")),
        (200, dict(admission="optimistic", prefix_cache=True)),
        (2000, dict(prefix_cache=True)),
    ):
        got = serve(folder, pool, **config)
        assert [r.output_ids for r in got] == [r.output_ids for r in reference], config
        if config.get("admission"):
            assert sum(r.preemptions for r in got) > 0 and sum(r.recomputed for r in got) > 0
        if config.get("prefix_cache"):
            assert sum(r.cached_tokens for r in got) >= 30 * 5  # the later requests reuse the shared 30-token start
