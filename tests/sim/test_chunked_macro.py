"""Chunked batching's macro-steps (slora_vtc/chunked_macro.py) against single steps: on random small
workloads (arrivals, token budgets, sequence caps, pool and block sizes, the prefix cache on and off,
every kind of scheduler: FCFS, VTC, LCF, RPM, weighted VTC, DLPM, VTC with each length prediction),
every request ends exactly as single steps end it, and every counter too. The expected values come
from single steps (EngineConfig.macro_steps off), the step rule itself.
"""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slora_vtc import chunked
from slora_vtc.backends.sim import TESTBEDS, SimBackend
from slora_vtc.chunked_macro import DecodeBlocks, slots_to_grow
from slora_vtc.chunked_macro import decode_ahead as ahead
from slora_vtc.experiment import Experiment
from slora_vtc.request import Request
from slora_vtc.runner import run_experiment
from slora_vtc.sched import build_scheduler
from tests.helpers.engine import config, make_engine, outcomes
from tests.helpers.sched import FakeBudget
from tests.helpers.workloads import arrivals

SCHEDULERS = ["fcfs", "vtc", "lcf", "rpm:30", "wvtc:1,2,1,3", "dlpm:600", "vtc-pred:0.5", "vtc-avg", "vtc-oracle"]


@settings(max_examples=250, deadline=None)
@given(
    requests=arrivals(),
    spec=st.sampled_from(SCHEDULERS),
    prefix_cache=st.booleans(),
    pool=st.integers(320, 4000),
    budget=st.sampled_from([16, 48, 64, 256, 2048]),
    max_seqs=st.sampled_from([1, 3, 8, 256]),
    block=st.sampled_from([1, 4, 16]),
)
def test_macro_steps_end_every_request_as_single_steps_do(requests, spec, prefix_cache, pool, budget, max_seqs, block):
    cfg = dict(
        clients="abcd", batching="chunked", prefix_cache=prefix_cache, pool_tokens=pool, max_num_batched_tokens=budget,
        max_num_seqs=max_seqs, block_size=block,
    )  # fmt: skip
    assert outcomes(requests, spec, macro_steps=True, **cfg) == outcomes(requests, spec, macro_steps=False, **cfg)


@settings(max_examples=300, deadline=None)
@given(
    spec=st.sampled_from(["fcfs", "vtc", "wvtc:1,2,3,4", "rpm:3"]),
    shapes=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(1, 50), st.integers(1, 50)), max_size=12),
    admitted=st.integers(0, 12),
    steps=st.integers(1, 40),
    newcomer=st.tuples(st.sampled_from("abcd"), st.integers(1, 50), st.integers(1, 50)),
)
def test_an_arrival_that_queues_behind_changes_no_head_and_no_counter(spec, shapes, admitted, steps, newcomer):
    """What lets a macro-step run past an arrival (Engine.arrival_horizon): where queues_behind says so,
    the arrival leaves what select tries first now and after each of the next steps, and every
    counter, as they were; queues_behind says so exactly when the arrival's client has requests
    waiting (its queue, FCFS: the one queue), and never behind a rate limit (whose window counts
    the arrivals before)."""
    sched, budget = build_scheduler(spec, list("abcd")), FakeBudget()
    for rid, (client, prompt, out) in enumerate(shapes):
        sched.on_arrival(Request(client, prompt, out, float(rid), rid=rid), float(rid))
    running = []
    while len(running) < admitted and (req := sched.peek(budget)) is not None:
        sched.pop(req, 100.0)
        sched.on_prefill(req, req.prompt_len, 0, 100.0)
        running.append(req)
    sched.on_decode_step(running, 101.0)
    client, prompt, out = newcomer
    new = Request(client, prompt, out, 200.0, rid=len(shapes))
    waiting = sched.waiting_by_client()
    behind = bool(waiting if spec == "fcfs" else waiting.get(client)) and spec != "rpm:3"  # a limit: never
    assert sched.queues_behind(new) == behind
    if not sched.queues_behind(new):
        return

    def seen() -> tuple:
        return sched.peek(budget), sched.heads(running, steps, budget), sched.counters() if sched.traits.ledger else 0

    before = seen()
    assert sched.on_arrival(new, 200.0)
    assert seen() == before


@pytest.mark.parametrize("spec", ["fcfs", "vtc"])
def test_a_macro_step_runs_past_arrivals_that_queue_behind(monkeypatch, spec):
    """Two requests decode 100 tokens; a prompt of 540 tokens waits behind them in a 600-token pool
    (it needs 34 blocks of 16; from their first decode on the two hold 4 of the pool's 37), and
    five requests of its client arrive behind it while they decode (from 1.5 s, 0.5 s apart; the
    first step ends at 1.21 s, the testbed's cold start, and the 99 decodes after it take about 3 s).
    Single steps admit nothing until the first finish, so those 99 steps are one macro-step; when
    the scheduler cannot say that the arrivals queue behind, each arrival cuts it: six."""
    waiting_behind = [Request("a", 16, 10, 1.5 + 0.5 * k, rid=3 + k) for k in range(5)]
    requests = [Request("a", 16, 100, 0.0, rid=0), Request("b", 16, 100, 0.0, rid=1)]
    requests += [Request("a", 540, 10, 0.001, rid=2), *waiting_behind]
    cfg = dict(batching="chunked", pool_tokens=600, block_size=16, max_num_batched_tokens=2048)

    def macro_steps_before_the_first_finish(says: bool) -> int:
        engine = make_engine(spec, SimBackend(TESTBEDS["a10g-2024"]), clients="ab", base=config(), **cfg)
        if not says:
            monkeypatch.setattr(engine.scheduler, "queues_behind", lambda req: False)
        starts = []
        monkeypatch.setattr(chunked, "decode_ahead", lambda c, *a: starts.append(engine.clock.now()) or ahead(c, *a))
        served = [copy.copy(r) for r in requests]
        engine.run(served)
        return sum(t < served[0].finish_time for t in starts)

    assert macro_steps_before_the_first_finish(True) == 1
    assert macro_steps_before_the_first_finish(False) == 6


def blocks_by_steps(spare: list[int], block: int, steps: int) -> int:
    """Brute force: blocks `steps` decode steps take, step by step (a request with p unwritten slots
    in its last block writes p tokens, then takes a block every block_size tokens)."""
    left, taken = list(spare), 0
    for _ in range(steps):
        for i, p in enumerate(left):
            if p == 0:
                taken, p = taken + 1, block
            left[i] = p - 1
    return taken


@settings(max_examples=200, deadline=None)
@given(data=st.data(), block=st.integers(1, 8), n=st.integers(1, 6))
def test_decode_blocks_count_as_steps_take_them(data, block, n):
    spare = data.draw(st.lists(st.integers(0, block - 1), min_size=n, max_size=n))
    blocks = DecodeBlocks(spare, block)
    for steps in range(0, 3 * block + 2):
        assert blocks.within(steps) == blocks_by_steps(spare, block, steps)
    for allowed in range(0, 3 * n + 2):
        most = blocks.steps_taking_at_most(allowed)
        assert blocks_by_steps(spare, block, most) <= allowed < blocks_by_steps(spare, block, most + 1)


@settings(max_examples=200, deadline=None)
@given(block=st.integers(1, 64), held=st.lists(st.integers(0, 2000), max_size=8), tokens=st.integers(0, 300))
def test_slots_to_grow_are_the_blocks_each_request_adds_one_token_at_a_time(block, held, tokens):
    """A request holding h tokens takes a new block whenever a token lands in a full last block:
    count those token by token (blocks of its own at h, at h + tokens)."""
    expected = []
    for h in held:
        slots, own = 0, h
        for _ in range(tokens):
            if own % block == 0:  # its last block is full (or it has none): the next token takes a new one
                slots += block
            own += 1
        expected.append(slots)
    assert slots_to_grow([-h % block for h in held], tokens, block) == expected  # from each one's spare slots


# The result files of whole suites (the first minute of the long ones), macro-steps on and off: every
# scheduler family, preemption-heavy pools (the ablation suites), small budgets, sequence caps and
# blocks, the prefix cache with its schedulers (tests/sim/test_chunked.py has nine more)
PREFIX = {"prefix_cache": True}
SUITE_CASES = [
    ("overload", "lcf", {}),
    ("overload", "rpm:20", {}),
    ("overload", "vtc-pred:0.5", {}),
    ("overload", "vtc-oracle", {}),
    ("overload_weighted", "wvtc:1,2,3,4", {}),
    ("overload", "vtc", {"cost": "profile"}),
    ("dist_shift", "vtc", {}),
    ("poisson_short_long", "fcfs", {}),
    ("on_off_overload", "vtc", {}),
    ("increase", "rpm:20", {}),
    ("proportional", "vtc", {}),
    ("real", "fcfs", {}),
    ("ablation_65k_256", "vtc", {}),
    ("ablation_35k_768", "fcfs", {}),
    ("ablation_35k_256", "lcf", {}),
    ("overload", "vtc", {"max_num_batched_tokens": 256}),
    ("overload", "fcfs", {"max_num_seqs": 8}),
    ("overload", "vtc", {"block_size": 32}),
    ("overload", "lcf", {"block_size": 1, "max_num_batched_tokens": 64}),
    ("prefix_chat", "vtc", PREFIX),
    ("prefix_chat", "fcfs", PREFIX),
    ("prefix_qa", "vtc", PREFIX),
    ("prefix_tot", "lcf", PREFIX),
    ("prefix_tot", "rpm:20", PREFIX),
]


@pytest.mark.slow
@pytest.mark.parametrize("suite,scheduler,extra", SUITE_CASES, ids=[f"{s}-{p}-{len(o)}" for s, p, o in SUITE_CASES])
def test_a_suite_writes_the_result_file_of_single_steps(suite, scheduler, extra):
    long = suite.startswith(("overload", "dist", "poisson", "on_off", "increase", "proportional"))
    exp = Experiment.of(suite=suite, scheduler=scheduler, duration=60.0 if long else None, batching="chunked", **extra)
    assert run_experiment(exp, macro_steps=True).to_json() == run_experiment(exp, macro_steps=False).to_json()
