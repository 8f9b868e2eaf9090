"""Chunked batching (slora_vtc/chunked.py) against a brute-force model of vLLM v1's step rule written
here from vLLM's scheduler, independently of the engine; its runs end clean; its macro-steps write
the result files single steps write; prompts charged chunk by chunk add up to one charge; bad input
is refused in one line."""

import math
from dataclasses import dataclass, replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slora_vtc.backends.base import ModelBackend, StepResult
from slora_vtc.backends.sim import TESTBEDS, SimBackend
from slora_vtc.config import EngineConfig
from slora_vtc.cost import ProfiledCost
from slora_vtc.errors import UserError
from slora_vtc.experiment import Experiment
from slora_vtc.request import Request, State
from slora_vtc.results import read_results
from slora_vtc.runner import run_experiment
from slora_vtc.sched import build_scheduler
from slora_vtc.sched.fcfs import FCFS
from slora_vtc.sched.vtc import VTC, Lift
from slora_vtc.steplog import read_step_log
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.engine import assert_clean, make_engine, run_engine
from tests.helpers.workloads import two_backlogged_clients


class StepRecorder(ModelBackend):
    """Every step takes one second; records what each step computed: [(rid, tokens, kind), ...]."""

    mixes = True

    def __init__(self):
        self.steps: list[list[tuple[int, int, str]]] = []

    def prefill(self, reqs):
        raise AssertionError("chunked batching has no prefill pass")

    def decode(self, reqs):
        raise AssertionError("chunked batching has no decode pass")

    def mixed(self, chunks, decodes):
        self.steps.append([(c.req.rid, c.length, "chunk") for c in chunks] + [(r.rid, 1, "decode") for r in decodes])
        return StepResult([None] * (len(chunks) + len(decodes)), 1.0)


# -- the brute-force model ------------------------------------------------------------------------
@dataclass
class Seq:
    rid: int
    arrival: float
    prompt: int
    out: int
    generated: int = 0
    computed: int = 0  # positions with K/V
    prefilling: bool = True
    computed_before: int = 0  # the most positions it had computed when it was preempted
    recomputed: int = 0  # positions computed again after a preemption

    def compute(self, n: int) -> None:
        self.recomputed += max(0, min(self.computed + n, self.computed_before) - self.computed)
        self.computed += n


def brute_force(shapes, budget: int, max_seqs: int, pool: int, block: int):
    """vLLM v1's schedule() with our plugin's FCFS, no prefix cache, one second per step: where the
    free blocks may not cover what the step could ask for (fewer than a budget's worth of blocks plus
    two per running request, plus one), the running list is first ordered by arrival (the plugin
    puts the scheduler's victims, the latest arrivals, last); then running requests (each its
    remaining prefill or its decode token, within the budget; when its new blocks are not free,
    preempt the last request of the list, until it fits or is itself preempted); then, if nothing
    was preempted, waiting requests in arrival order while the budget and the sequence cap allow and
    the free blocks would hold the whole prefill (vLLM 0.32's default, scheduler_reserve_full_isl);
    a step that scheduled nothing runs no forward pass. Returns the steps and each request's end
    (with the positions it computed again after preemptions)."""
    blocks = pool // block
    seqs = [Seq(rid, a, p, o) for rid, (a, p, o) in enumerate(shapes)]
    pending = list(seqs)
    waiting: list[Seq] = []
    running: list[Seq] = []
    steps, ended = [], {}
    t = 0.0

    def held(s: Seq) -> int:
        return math.ceil(s.computed / block)

    def free() -> int:
        return blocks - sum(held(s) for s in running)

    while pending or waiting or running:
        while pending and pending[0].arrival <= t:
            s = pending.pop(0)
            if math.ceil((s.prompt + s.out - 1) / block) > blocks:
                ended[s.rid] = ("rejected", t, 0)
            else:
                waiting.append(s)
        step, left, preempted, i = [], budget, False, 0
        if free() < budget // block + 2 * len(running) + 1:
            running.sort(key=lambda r: (r.arrival, r.rid))
        while i < len(running) and left > 0:
            s = running[i]
            n = min(s.prompt + s.generated - s.computed, left)
            need = math.ceil((s.computed + n) / block) - held(s)
            gone = False
            while need > free():
                victim = running.pop()
                victim.computed_before = max(victim.computed_before, victim.computed)
                victim.computed, victim.prefilling = 0, True
                waiting.append(victim)
                waiting.sort(key=lambda r: (r.arrival, r.rid))
                preempted = True
                if victim is s:
                    gone = True
                    break
            if gone:
                break
            s.compute(n)
            step.append((s.rid, n, "chunk" if s.prefilling else "decode"))
            left -= n
            i += 1
        while not preempted and left > 0 and waiting and len(running) < max_seqs:
            s = waiting[0]
            n = min(s.prompt + s.generated, left)
            if math.ceil((s.prompt + s.generated) / block) > free():  # its whole prefill, not only the chunk
                break
            waiting.pop(0)
            running.append(s)
            s.compute(n)
            step.append((s.rid, n, "chunk"))
            left -= n
        if not step and preempted:  # only preempted (its first request chose itself): no forward pass
            continue
        if not step:
            assert not (waiting or running), "the step rule left work undone with nothing scheduled"
            if pending:
                t = pending[0].arrival
            continue
        t += 1.0
        # a mixed step lists its chunks, then its decodes (ModelBackend.mixed), each in scheduling order
        steps.append([e for e in step if e[2] == "chunk"] + [e for e in step if e[2] == "decode"])
        for rid, _, kind in step:
            s = seqs[rid]
            if kind == "chunk" and s.computed < s.prompt + s.generated:
                continue
            s.prefilling = False
            s.generated += 1
            if s.generated == s.out:
                running.remove(s)
                ended[rid] = ("finished", t, s.recomputed)
    return steps, ended


shape = st.tuples(st.integers(0, 40).map(lambda x: x / 2), st.integers(1, 60), st.integers(1, 30))


@settings(max_examples=300, deadline=None)
@given(
    shapes=st.lists(shape, min_size=1, max_size=12).map(lambda s: sorted(s, key=lambda x: x[0])),
    block=st.sampled_from([1, 2, 4, 16]),
    budget_blocks=st.integers(1, 8),
    max_seqs=st.integers(1, 6),
    pool=st.integers(16, 200),
)
@example(shapes=[(0.0, 40, 5), (0.0, 40, 5), (0.0, 40, 5)], block=4, budget_blocks=4, max_seqs=3, pool=100)
def test_the_engine_schedules_what_vllms_step_rule_schedules(shapes, block, budget_blocks, max_seqs, pool):
    budget = block * budget_blocks
    expected_steps, expected_ends = brute_force(shapes, budget, max_seqs, pool, block)
    backend = StepRecorder()
    requests = [Request(f"c{i % 3}", p, o, a, rid=i) for i, (a, p, o) in enumerate(shapes)]
    engine, _ = run_engine(
        FCFS(), requests, backend, pool_tokens=pool, batching="chunked",
        max_num_batched_tokens=budget, max_num_seqs=max_seqs, block_size=block,
    )  # fmt: skip
    assert backend.steps == expected_steps
    assert {r.rid: (r.state.value, r.finish_time, r.recomputed) for r in requests} == expected_ends
    assert_clean(engine, requests)


# -- runs of the simulator ------------------------------------------------------------------------
SIM_CASES = [
    ("overload", "vtc", {}),
    ("overload", "vtc", {"prefix_cache": True}),
    ("overload", "fcfs", {}),
    ("overload_weighted", "wvtc:1,2,3,4", {}),
    ("overload", "vtc", {"cost": "profile"}),
    ("real", "vtc", {"horizon": 200.0}),
    ("dist_shift", "lcf", {}),
    ("prefix_qa", "lpm", {"prefix_cache": True}),
    ("prefix_chat", "dlpm:8000", {"prefix_cache": True}),
    ("prefix_judge", "vtc", {"prefix_cache": True, "charge_cached": 0.0}),
]


def chunked_experiment(suite: str, scheduler: str, extra: dict, **chunked) -> Experiment:
    duration = 60.0 if suite in ("overload", "overload_weighted", "dist_shift") else None
    return Experiment.of(suite=suite, scheduler=scheduler, duration=duration, batching="chunked", **chunked, **extra)


@pytest.mark.parametrize("suite,scheduler,extra", SIM_CASES, ids=[f"{s}-{p}" for s, p, _ in SIM_CASES])
def test_macro_steps_write_the_result_file_of_single_steps(suite, scheduler, extra):
    exp = chunked_experiment(suite, scheduler, extra)
    single, macro = run_experiment(exp, macro_steps=False), run_experiment(exp, macro_steps=True)
    assert macro.to_json() == single.to_json()
    assert macro.config["batching"] == "chunked" and macro.config["max_num_batched_tokens"] == 2048


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_a_simulated_run_ends_clean(prefix_cache):
    suite = "prefix_chat" if prefix_cache else "overload"
    exp = chunked_experiment(suite, "vtc", {"prefix_cache": prefix_cache}, max_num_batched_tokens=256)
    workload = exp.workload.build()
    requests = exp.requests(workload)
    scheduler = build_scheduler("vtc", list(workload.clients))
    config = exp.engine_config()
    backend = SimBackend(TESTBEDS["a10g-2024"])
    engine, ended = run_engine(scheduler, requests, backend, base=config)
    engine.memory.flush()
    assert_clean(engine, requests)
    assert len(ended) == len(requests)
    assert any(r.preemptions for r in requests) or prefix_cache  # overload on 10,000 tokens preempts


def test_a_preempted_request_without_ids_finds_its_own_blocks_again():
    """vLLM's prefix cache knows each block by its tokens, so a preempted request finds its blocks
    again though nobody shares its prompt (the overload suite's prompts are lengths: none is shared)."""

    def responses(prefix_cache: bool):
        return run_experiment(chunked_experiment("overload", "vtc", {"prefix_cache": prefix_cache})).responses

    with_cache, without = responses(True), responses(False)
    assert any(r.preemptions for r in without) and not any(r.cached_tokens for r in without)
    reused = [r for r in with_cache if r.cached_tokens]
    assert reused and all(r.preemptions for r in reused)  # a hit is always a preempted request's own blocks
    assert sum(r.recomputed for r in with_cache) < sum(r.recomputed for r in without)


# -- charging ------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 300), st.integers(1, 40), st.sampled_from("abc")),
        min_size=1,
        max_size=10,
    ),
    budget=st.integers(16, 128),
    pool=st.integers(400, 1200),
)
def test_chunk_charges_add_up_to_one_charge_per_request(shapes, budget, pool):
    """LCF (no lift) with the profiled cost, whose h(x, 0) is not linear in x: whatever the chunks and
    preemptions, each client's counter ends at what one charge of the prompt and one of each token
    but the prefill's (which is free) come to: h(x, 0) + h(x, y) - h(x, 1) per finished request."""
    cost = ProfiledCost()
    requests = [Request(c, p, o, a, rid=i) for i, (a, p, o, c) in enumerate(sorted(shapes))]
    scheduler = VTC(cost=cost, lift=Lift.NONE)
    engine, _ = run_engine(
        scheduler, requests, StepRecorder(), pool_tokens=pool, batching="chunked",
        max_num_batched_tokens=budget, block_size=16,
    )  # fmt: skip
    assert_clean(engine, requests)
    for client in {r.client for r in requests}:
        mine = [r for r in requests if r.client == client and r.state is State.FINISHED]
        expected = sum(
            cost(r.prompt_len, 0) + cost(r.prompt_len, r.max_new_tokens) - cost(r.prompt_len, 1) for r in mine
        )
        assert scheduler.counter_of(client) == pytest.approx(expected, rel=1e-9, abs=1e-6)


class ChargingWithoutLedger(FCFS):
    """A scheduler that charges prompts but keeps no counters to refund them."""

    def on_prefill(self, req, computed, cached, now):
        return float(computed)


def test_a_scheduler_that_cannot_refund_a_chunk_is_refused():
    requests = [Request("a", 100, 4, 0.0)]
    with pytest.raises(UserError, match="ChargingWithoutLedger charges prompts but keeps no ledger"):
        run_engine(ChargingWithoutLedger(), requests, StepRecorder(), batching="chunked", max_num_batched_tokens=32)


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings,message",
    [
        ({"batching": "paged"}, "unknown --batching 'paged' (known: slora, chunked)"),
        ({"max_num_batched_tokens": 8}, "--max-num-batched-tokens (8) is smaller than a block (--block-size 16)"),
        ({"max_num_seqs": 0}, "--max-num-seqs must be positive, got 0"),
        ({"block_size": -1}, "--block-size must be positive, got -1"),
        ({"max_num_batched_tokens": 0}, "--max-num-batched-tokens must be positive, got 0"),
        ({"batching": "chunked", "pool_tokens": 8}, "a pool of 8 tokens is smaller than a block (--block-size 16)"),
    ],
)
def test_bad_engine_settings_are_one_line(settings, message):
    with pytest.raises(UserError) as e:
        replace(EngineConfig(), **settings)
    assert str(e.value) == message


def test_a_request_that_never_fits_in_blocks_is_rejected():
    """Under chunked batching the prompt has no cap, but the K/V of every token but the last, in whole
    blocks, must fit: 40 + 9 - 1 = 48 tokens are three blocks of 16; a pool of 47 holds two."""
    fits, too_big = Request("a", 40, 9, 0.0), Request("a", 40, 9, 0.0)
    _, ended = run_engine(FCFS(), [fits], StepRecorder(), pool_tokens=48, batching="chunked")
    _, ended2 = run_engine(FCFS(), [too_big], StepRecorder(), pool_tokens=47, batching="chunked")
    assert fits.state is State.FINISHED and too_big.state is State.REJECTED


CHUNKED = ["run", "--suite", "overload", "--scheduler", "vtc", "--duration", "10", "--batching", "chunked"]


@pytest.mark.parametrize(
    "extra,parts",
    [
        (["--max-num-batched-tokens", "8"], ["--max-num-batched-tokens (8) is smaller than a block (--block-size 16)"]),
        (["--max-num-batched-tokens", "32", "--block-size", "64"], ["smaller than a block (--block-size 64)"]),
        (["--max-num-seqs", "0"], ["--max-num-seqs must be positive, got 0"]),
        (["--block-size", "0"], ["--block-size must be positive, got 0"]),
        (["--pool-tokens", "300"], ["cannot hold a single request"]),
        (["--replicas", "2", "--step-log", "STEPS"], ["--step-log", "--replicas"]),
    ],
)
def test_bad_chunked_input_on_the_cli_is_one_line(capsys, tmp_path, extra, parts):
    extra = [str(tmp_path / "steps.jsonl") if a == "STEPS" else a for a in extra]
    code, _, err = run_cli(capsys, *CHUNKED, *extra, "--out", tmp_path / "r.jsonl")
    assert_one_line_error(code, err, *parts)


def test_the_step_log_has_a_record_per_step_that_adds_up(capsys, tmp_path):
    """--step-log: one record per forward pass; the prompt tokens it says were computed are the
    workload's (nothing cached, nothing preempted on a pool this large), the decodes one per token
    but the prefill's, and the step times add up to the run's end."""
    steps_file = tmp_path / "steps.jsonl"
    code, _, err = run_cli(
        capsys, *CHUNKED, "--pool-tokens", "60000", "--max-num-batched-tokens", "512",
        "--step-log", steps_file, "--out", tmp_path / "r.jsonl",
    )  # fmt: skip
    assert code == 0, err
    steps = read_step_log(steps_file)
    result = read_results(tmp_path / "r.jsonl")[0]
    finished = [r for r in result.responses if r.status == "finished"]
    assert len(finished) == len(result.responses)
    assert [s.step for s in steps] == list(range(len(steps)))
    assert all(s.prefill_tokens + s.decode_reqs <= 512 and s.preempted == 0 and s.gap_s == 0 for s in steps)
    assert sum(s.prefill_tokens for s in steps) == sum(r.prompt_len + 1 for r in finished)  # + the BOS
    assert sum(s.decode_reqs for s in steps) == sum(r.output_len - 1 for r in finished)
    last, first_arrival = steps[-1], min(r.req_time for r in finished)  # the first step starts at it
    assert last.t + last.wall_s == pytest.approx(result.total_time - first_arrival, rel=1e-9)
    assert all(b.t == pytest.approx(a.t + a.wall_s, abs=1e-9) or b.t > a.t + a.wall_s for a, b in zip(steps, steps[1:]))
    assert [s.arrived for s in steps] == arrived_before_each(steps, finished)


def arrived_before_each(steps, responses) -> list[int]:
    """The requests that arrived after one step started and no later than the next one's start (the
    engine takes in what has arrived, then steps): each step's `arrived`, counted from the arrivals."""
    first, arrivals = min(r.req_time for r in responses), sorted(r.req_time for r in responses)
    by_start = [sum(a <= first + s.t + 1e-9 for a in arrivals) for s in steps]
    return [n - m for n, m in zip(by_start, [0, *by_start])]


def test_the_slora_loop_logs_its_steps_too(capsys, tmp_path):
    steps_file = tmp_path / "steps.jsonl"
    code, _, err = run_cli(capsys, *CHUNKED[:-2], "--step-log", steps_file, "--out", tmp_path / "r.jsonl")
    assert code == 0, err
    steps = read_step_log(steps_file)
    result = read_results(tmp_path / "r.jsonl")[0]
    finished = [r for r in result.responses if r.status == "finished"]
    assert all((s.prefill_reqs == 0) != (s.decode_reqs == 0) for s in steps)  # S-LoRA: never mixed
    assert [s.arrived for s in steps] == arrived_before_each(steps, finished)
    assert sum(s.prefill_tokens for s in steps) == sum(r.prompt_len + 1 for r in finished)
    assert sum(s.decode_reqs for s in steps) == sum(r.output_len - 1 for r in finished)


# -- VTC's bound under chunked prefill (docs/design.md, "Chunked batching") ------------------------
W_P, W_Q, POOL = 1, 2, 600


def chunked_bound(requests, max_seqs: int, block: int) -> float:
    """N * (w_p * L_in + w_q * L_out), N = min(max_num_seqs, pool // block_size): at most N requests
    of the leading client run, and it is charged for nothing else while it leads."""
    n = min(max_seqs, POOL // block)
    return n * (W_P * max(r.prompt_len for r in requests) + W_Q * max(r.max_new_tokens for r in requests))


def backlogged_gaps(spec, requests, budget, max_seqs, block):
    """Counter and delivered-service gaps of the two clients after each step in which both wait."""
    sched = build_scheduler(spec, ["a", "b"])
    engine = make_engine(
        sched, StepRecorder(), pool_tokens=POOL, batching="chunked",
        max_num_batched_tokens=budget, max_num_seqs=max_seqs, block_size=block,
    )  # fmt: skip
    gaps = []

    def on_step():
        if {r.client for r in requests if r.state is State.WAITING} == {"a", "b"}:
            counters = abs(sched.counter_of("a") - sched.counter_of("b")) if sched.traits.ledger else None
            gaps.append(counters)

    engine.run(requests, on_step=on_step)
    assert all(r.state is State.FINISHED for r in requests)
    return gaps


@settings(max_examples=40, deadline=None)
@given(
    requests=two_backlogged_clients(most=40),
    budget=st.sampled_from([16, 32, 64, 128, 256, 512]),
    max_seqs=st.integers(1, 4),
    block=st.sampled_from([1, 16]),
)
def test_vtc_keeps_backlogged_clients_within_the_chunked_bound(requests, budget, max_seqs, block):
    limit = chunked_bound(requests, max_seqs, block)
    assert all(gap <= limit for gap in backlogged_gaps("vtc", requests, budget, max_seqs, block))


def test_fcfs_breaks_the_chunked_bound():
    """Client b sends twice as fast as a, all far above capacity: FCFS serves b twice as much."""
    a = [Request("a", 100, 100, 0.002 * k) for k in range(40)]
    b = [Request("b", 100, 100, 0.001 * k + 0.0005) for k in range(80)]
    sched = build_scheduler("fcfs", ["a", "b"])
    delivered = {"a": 0, "b": 0}
    gaps = []

    def on_step():
        for c in delivered:
            delivered[c] = sum(W_P * r.prompt_len + W_Q * r.generated for r in a + b if r.client == c and r.generated)
        if {r.client for r in a + b if r.state is State.WAITING} == {"a", "b"}:
            gaps.append(abs(delivered["a"] - delivered["b"]))

    engine = make_engine(sched, StepRecorder(), pool_tokens=POOL, batching="chunked", max_num_seqs=2)
    engine.run(a + b, on_step=on_step)
    assert max(gaps) > 2 * chunked_bound(a + b, 2, 16)


def test_a_backend_without_mixed_steps_cannot_run_chunked_batching():
    with pytest.raises(UserError, match="FixedBackend cannot run --batching chunked") as e:
        make_engine("vtc", batching="chunked")
    assert "\n" not in str(e.value)


def test_requests_that_finish_in_one_step_end_in_the_running_lists_order():
    """vLLM frees the requests that finish in a step in the order it scheduled them (its running
    list's, then the ones it started), and its prefix cache evicts the blocks freed first first: a
    soak of tests/vllm/test_step_rule.py found runs (seeds 6344 and 7755, FCFS, shared prefixes)
    where freeing in another order made a later request miss a block vLLM kept. Here `a` decodes
    its last token in the step that starts `b`, whose only token comes with its prefill: `a` ends
    first, though `b`'s chunk comes first in the step's plan."""
    ended = []
    a, b = Request("a", 8, 3, 0.0, rid=0), Request("b", 8, 1, 1.5, rid=1)
    engine = make_engine(
        "fcfs", StepRecorder(), clients=["a", "b"], on_end=ended.append, pool_tokens=64,
        batching="chunked", max_num_batched_tokens=64, max_num_seqs=4, block_size=4,
    )  # fmt: skip
    engine.run([a, b])
    assert engine.backend.steps[-1] == [(1, 8, "chunk"), (0, 1, "decode")]  # both end in this step
    assert [r.rid for r in ended] == [0, 1]
