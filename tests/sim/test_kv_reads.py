"""The K/V that the prefix cache serves was computed, for the same tokens (chunked batching, and S-LoRA's loop).

A backend here makes tokens (so that outputs enter the tree too) and keeps, per pool slot, the token
prefix whose K/V the last step that wrote the slot computed: a chunk writes its positions, a decode
its newest token's. Every position a step reads (a chunk's earlier positions, a decode's context),
whether the request computed it or the tree lent it, must have been written for exactly that prefix.
A running request that the running pass preempts after scheduling it (its tokens taken back) has
computed nothing in that step: its scheduled slots hold no K/V and must not enter the tree.
"""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from slora_vtc.backends.base import ModelBackend, StepResult
from slora_vtc.request import Request
from slora_vtc.sched import build_scheduler
from tests.helpers.engine import assert_clean, run_engine

PREFIXES = [list(range(100 * k, 100 * k + 40)) for k in range(1, 3)]  # shared prompt starts


class WrittenSlots(ModelBackend):
    """Each step takes a second; token t of a request is 7 + its position (deterministic, so prefixes repeat)."""

    mixes = True

    def __init__(self):
        self.written: dict[int, tuple[int, ...]] = {}  # slot -> the token prefix its K/V was computed for
        self.bad_reads: list[tuple[int, int]] = []  # (rid, position) read where no step computed that prefix

    def prefill(self, reqs):  # S-LoRA's loop: each prompt from its hit on
        return self._compute([(r, r.cached_len, r.prefill_len) for r in reqs])

    def decode(self, reqs):
        return self._compute([(r, r.prompt_len + r.generated - 1, r.prompt_len + r.generated) for r in reqs])

    def mixed(self, chunks, decodes):
        return self._compute(
            [(c.req, c.start, c.start + c.length) for c in chunks]
            + [(r, r.prompt_len + r.generated - 1, r.prompt_len + r.generated) for r in decodes]
        )

    def _compute(self, spans: list[tuple[Request, int, int]]) -> StepResult:
        """Each request reads positions [0, start) and computes [start, end)."""
        for req, start, end in spans:
            ids = [*req.prompt_ids, *req.output_ids]
            for pos in range(start):  # read
                if self.written.get(req.kv_slots[pos]) != tuple(ids[: pos + 1]):
                    self.bad_reads.append((req.rid, pos))
            for pos in range(start, end):  # written
                self.written[req.kv_slots[pos]] = tuple(ids[: pos + 1])
        return StepResult([7 + r.prompt_len + r.generated for r, _, _ in spans], 1.0)


@st.composite
def workloads(draw) -> list[Request]:
    """Requests with shared prompt starts, and follow-ups: a later request's prompt that goes on
    from an earlier one's prompt and outputs (a chat's next turn; outputs are known in advance here)."""
    shapes = draw(
        st.lists(
            st.tuples(st.integers(0, 12), st.integers(1, 40), st.integers(1, 30), st.sampled_from("ab")),
            min_size=2,
            max_size=12,
        )
    )
    rng = random.Random(draw(st.integers(0, 2**16)))
    requests: list[Request] = []
    for rid, (arrival, prompt, out, client) in enumerate(sorted(shapes)):
        if requests and rng.random() < 0.5:
            turn = rng.choice(requests)
            start = turn.prompt_ids + [7 + q for q in range(turn.prompt_len, turn.prompt_len + turn.max_new_tokens)]
        else:
            start = PREFIXES[rng.randrange(len(PREFIXES))]
        ids = start[: rng.randrange(len(start) + 1)]
        ids = ids + [rng.randrange(10**4, 2 * 10**4) for _ in range(prompt)]
        requests.append(Request(client, len(ids), out, float(arrival), rid=rid, prompt_ids=ids))
    return requests


@settings(max_examples=150, deadline=None)
@given(
    requests=workloads(),
    spec=st.sampled_from(["fcfs", "vtc"]),
    pool=st.integers(96, 400),
    budget=st.sampled_from([8, 16, 32, 64]),
    block=st.sampled_from([1, 4, 8]),
)
def test_the_prefix_cache_serves_only_kv_computed_for_its_tokens(requests, spec, pool, budget, block):
    backend = WrittenSlots()
    engine, _ = run_engine(
        build_scheduler(spec, ["a", "b"]), requests, backend, pool_tokens=pool, batching="chunked",
        prefix_cache=True, max_num_batched_tokens=budget, max_num_seqs=4, block_size=block,
    )  # fmt: skip
    assert backend.bad_reads == []
    engine.memory.flush()
    assert_clean(engine, requests)


@settings(max_examples=120, deadline=None)
@given(
    requests=workloads(),
    spec=st.sampled_from(["fcfs", "vtc"]),
    pool=st.integers(96, 400),
    admission=st.sampled_from(["conservative", "optimistic"]),
)
def test_s_lora_loop_too(requests, spec, pool, admission):
    """The same in S-LoRA's loop, whose preemption (optimistic admission) frees a whole batch's slots."""
    backend = WrittenSlots()
    engine, _ = run_engine(
        build_scheduler(spec, ["a", "b"]), requests, backend, pool_tokens=pool, prefix_cache=True, admission=admission
    )
    assert backend.bad_reads == []
    engine.memory.flush()
    assert_clean(engine, requests)


def served(spec: str, shapes: list[tuple], **cfg) -> tuple[WrittenSlots, list[Request]]:
    """Run (client, prompt ids, output length, arrival) requests; the backend and the requests."""
    requests = [Request(c, len(ids), out, t, rid=i, prompt_ids=ids) for i, (c, ids, out, t) in enumerate(shapes)]
    backend = WrittenSlots()
    engine, _ = run_engine(
        build_scheduler(spec, ["a", "b"]),
        requests,
        backend,
        batching="chunked",
        prefix_cache=True,
        max_num_seqs=4,
        **cfg,
    )
    engine.memory.flush()
    assert_clean(engine, requests)
    return backend, requests


def test_a_follow_up_that_fits_alone_is_served_with_its_hits_in_whole_blocks():
    """A case the property above found. The follow-up needs 94 positions at its end: 24 blocks of 4,
    the whole pool. It is preempted while the first turn runs and comes back to a tree holding part
    of what it needs. Locked as matched, a hit that ends mid-block starts the request's own tokens
    mid-block, so that its own blocks and the hit together need more than 24 blocks' slots: it never
    fits, and the engine stopped with it waiting. Hits count in whole blocks, as vLLM's. (Since the
    engine admits a request only when its whole prefill fits, as vLLM 0.32 does, the follow-up waits
    for the first turn to end instead of being preempted; it must still fit with its hit.)"""
    first = [*range(200, 226), *range(10_000, 10_027)]  # 53 tokens
    follow_up = first + [7 + q for q in range(53, 61)] + [20_001, 20_002, 20_003, 20_004]  # its 8 outputs, then 4 new
    backend, (a, b) = served("fcfs", [("a", first, 8, 0.0), ("a", follow_up, 30, 1.0)],
                             pool_tokens=96, max_num_batched_tokens=8, block_size=4)  # fmt: skip
    assert b.generated == 30
    assert b.cached_tokens > 0 and b.cached_tokens % 4 == 0
    assert backend.bad_reads == []


def test_a_request_preempted_after_it_was_scheduled_leaves_no_uncomputed_kv():
    """A case the property above found: under VTC a running request that a step had scheduled is
    preempted in that step; the slot its decode would have written joined the tree, and the third
    request (a follow-up of the second) read K/V there that no step had computed."""
    p1 = [*range(200, 224), 19867, 11133, 18141, 16107, 15713, 14780, 10407, 15980, 18743, 14941, 12390]
    tail = [10203, 19106, 19236, 15447, 12416, 16811, 11195, 15009, 13676, 17379, 17434, 18819, 14072]
    tail += [10353, 15067, 19317, 15708, 17283, 16694, 12569, 16687, 17803, 18501, 17395, 18898]
    shapes = [
        ("a", [*range(200, 240), 11248, 16954, 11605, 10937, 18003, 12157, 12398, 16207, 11679, 10505, 14934], 25, 4.0),
        ("a", p1, 25, 4.0),
        ("a", p1 + [*range(42, 56)] + tail, 20, 10.0),  # the second's prompt and 14 of its outputs, then its own
        ("b", [*range(200, 207), 18633, 14174, 16498, 13289, 14708, 18720, 12381, 15511, 13859, 13391, 18469, 15802,
               17759, 17655, 17899, 16164, 13828, 16815, 12010, 17091, 17952, 15529, 13529, 12497, 11032], 25, 11.0),
    ]  # fmt: skip
    backend, _ = served("vtc", shapes, pool_tokens=128, max_num_batched_tokens=16, block_size=1)
    assert backend.bad_reads == []
