"""The engine with the real backend: pool accounting with adapters, failure isolation, fairness, end to end."""

import subprocess
import sys
import time

import pytest
import torch

from slora_vtc.cli import main
from slora_vtc.clock import WallClock
from slora_vtc.experiment import Experiment
from slora_vtc.model.llama import Decode
from slora_vtc.request import State
from slora_vtc.results import read_results
from tests.helpers.engine import assert_clean
from tests.helpers.llama import dummies, real_engine, record_logits, request, tiny_backend

RANK = 4
ADAPTER_SLOTS = 4 * RANK * 2  # the tiny model is GQA: two slots per adapter row


def prompt(n: int, seed: int) -> list[int]:
    return [1] + torch.randint(3, 256, (n - 1,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_pool_is_clean_after_a_run_and_adapters_share_it_with_kv():
    backend = tiny_backend(pool=400, adapters=dummies(2, RANK))
    loads = []
    load = backend.load_adapter
    backend.load_adapter = lambda name, slots: (loads.append(name), load(name, slots))
    engine = real_engine(backend, pool=400)
    engine.memory._on_load = backend.load_adapter
    adapters = ["dummy-0", "dummy-1", None]
    requests = [
        request(
            prompt(8 + 5 * (i % 4), i), 6 + 3 * (i % 5), client="abc"[i % 3], adapter=adapters[i % 3], arrival=0.01 * i
        )
        for i in range(30)
    ]
    mem = engine.memory

    def on_step():
        kv = sum(len(r.kv_slots) for r in engine.running)
        assert mem.pool.num_used == kv + ADAPTER_SLOTS * len(mem.adapters) <= mem.pool.size
        assert set(mem.adapters) == {r.adapter for r in engine.running} - {None}

    engine.run(requests, on_step=on_step)
    assert_clean(engine, requests)
    assert all(r.state is State.FINISHED for r in requests)
    assert len(loads) > 2  # adapters left the pool when idle and were loaded again
    assert backend.rows.row_of == {}  # every request's device-side state was released


def test_adapter_slots_count_in_admission():
    """Two requests fit the pool together without adapters, not with two distinct ones."""

    def served(adapters):
        backend = tiny_backend(pool=200, adapters=dummies(2, RANK))
        reqs = [request(prompt(40, i), 40, adapter=a) for i, a in enumerate(adapters)]
        engine = real_engine(backend, pool=200)
        engine.run(reqs)
        assert_clean(engine, reqs)
        return reqs

    a, b = served(["dummy-0", "dummy-0"])  # 2 * 80 + 32 < 200: admitted together
    assert a.first_token_time == b.first_token_time
    a, b = served(["dummy-0", "dummy-1"])  # 2 * 80 + 2 * 32 > 200: b waits until a has made room
    assert b.first_token_time > a.first_token_time
    assert (
        Experiment.of(suite="overload", scheduler="vtc", backend="torch", adapters=1, adapter_rank=8)
        .engine_config()
        .slots_of("dummy-0")
        == 64
    )
    assert (
        Experiment.of(suite="overload", scheduler="vtc").engine_config().adapter_slots == 32
    )  # the simulator's default is unchanged


def test_a_request_that_fails_in_the_model_is_aborted_and_the_rest_served():
    def serve(poison: bool):
        backend = tiny_backend(pool=300)
        forward = backend.model.forward

        def failing_forward(batch):
            if poison and (77 in batch.tokens.tolist() or isinstance(batch, Decode) and 30 in batch.positions.tolist()):
                raise RuntimeError("injected failure")
            return forward(batch)

        backend.model.forward = failing_forward
        reqs = [
            request(prompt(6, 1), 8),
            request([1, 5, 77, 9], 8),
            request(prompt(25, 2), 12),
            request(prompt(5, 3), 10),
            request([1, 300, 2], 4),
        ]  # 300 is outside the vocabulary: refused before the model runs
        engine = real_engine(backend, pool=300)
        engine.run(reqs)
        assert_clean(engine, reqs)
        return reqs

    clean, poisoned = serve(False), serve(True)
    assert [r.state for r in poisoned] == [State.FINISHED, State.ABORTED, State.ABORTED, State.FINISHED, State.ABORTED]
    assert poisoned[2].generated == 30 - 25 + 1  # failed at its decode step that feeds position 30
    for c, p in zip(clean, poisoned):
        if p.state is State.FINISHED:
            assert p.output_ids == c.output_ids
    assert all("model failed" in r.reason for r in poisoned if r.state is State.ABORTED)


def backlogged_service_gaps(scheduler: str) -> tuple[list[float], float]:
    """Two clients send all their requests at once (b twice as many, interleaved a, b, b, ...)."""
    reqs = []
    for k in range(16):
        reqs.append(request(prompt(30, k), 30, client="a"))
        reqs += [request(prompt(30, 100 + 2 * k + j), 30, client="b") for j in range(2)]
    engine = real_engine(tiny_backend(pool=300), pool=300, scheduler=scheduler, clients=("a", "b"))
    gaps = []

    def service(client):
        return sum(r.prompt_len + 2 * r.generated for r in reqs if r.client == client and r.generated)

    def on_step():
        if {r.client for r in reqs if r.state is State.WAITING} == {"a", "b"}:
            gaps.append(abs(service("a") - service("b")))

    engine.run(reqs, on_step=on_step)
    assert_clean(engine, reqs)
    bound = 2 * max(1 * 30, 2 * 300)  # paper Thm 4.4: 2 * max(w_p * L_input, w_q * M), M = pool tokens
    return gaps, bound


def test_vtc_keeps_backlogged_clients_within_the_bound_and_fcfs_does_not():
    vtc, bound = backlogged_service_gaps("vtc")
    fcfs, _ = backlogged_service_gaps("fcfs")
    assert len(vtc) > 50 and max(vtc) <= bound
    assert max(fcfs) > bound and fcfs[-1] > fcfs[len(fcfs) // 2]  # FCFS's gap keeps growing


@pytest.mark.slow
def test_run_end_to_end_on_cpu_writes_the_simulators_result_file(capsys, tmp_path):
    out = tmp_path / "real.jsonl"
    code = main(
        [
            "run",
            "--backend",
            "torch",
            "--model",
            "tiny",
            "--suite",
            "overload",
            "--scheduler",
            "vtc",
            "--duration",
            "4",
            "--time-scale",
            "20",
            "--pool-tokens",
            "3000",
            "--adapters",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0 and "wrote" in capsys.readouterr().out
    (result,) = read_results(out)
    assert (
        result.config["backend"] == "torch" and result.config["model"] == "tiny" and result.config["time_scale"] == 20
    )
    assert len(result.responses) == 18 and result.count("finished") == 18
    assert all(r.first_token_latency > 0 and r.request_latency >= r.first_token_latency for r in result.responses)


def test_scaled_wall_clock():
    clock = WallClock(scale=50)
    clock.wait_until(1.0)  # 1 workload second = 20 ms of wall time
    assert 1.0 <= clock.now() < 25.0  # woke within half a wall second, however busy the machine
    start = time.perf_counter()
    clock.wait_until(2.0)
    assert time.perf_counter() - start < 0.5


@pytest.mark.slow
def test_the_simulator_path_does_not_import_torch(tmp_path):
    code = (
        "import sys; from slora_vtc.cli import main; "
        "assert main(['run', '--suite', 'overload', '--scheduler', 'vtc', '--duration', '20', "
        f"'--out', r'{tmp_path / 'r.jsonl'}']) == 0; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_logits_of_a_request_do_not_depend_on_its_batch():
    """Continuous batching: a request admitted mid-run (joining a decoding batch) gets the same logits."""
    backend = tiny_backend(pool=400)
    logits = record_logits(backend)
    first, late = request(prompt(20, 5), 40), request(prompt(9, 6), 6, arrival=0.0)
    late.arrival = 1e-9  # arrives after the first prefill: joins at the next admission round
    real_engine(backend, pool=400).run([first, late])
    alone = tiny_backend(pool=400)
    alone_logits = record_logits(alone)
    solo = request(prompt(9, 6), 6)
    real_engine(alone, pool=400).run([solo])
    torch.testing.assert_close(torch.stack(logits[late.rid]), torch.stack(alone_logits[solo.rid]), atol=1e-5, rtol=1e-5)
    assert late.first_token_time > first.first_token_time


def test_request_rows_are_reused():
    """20 requests through a pool that holds 3 at a time: they share the first 8 rows."""
    backend = tiny_backend(pool=60)
    used = set()
    add = backend.rows.add
    backend.rows.add = lambda rids, capacity: (rows := add(rids, capacity), used.update(rows))[0]
    engine = real_engine(backend, pool=60)
    requests = [request(prompt(10, i), 5) for i in range(20)]
    running = []
    engine.run(requests, on_step=lambda: running.append(len(engine.running)))
    assert all(r.generated == 5 for r in requests)
    assert max(running) == 3  # 15 tokens each; a fourth would need 60 >= pool
    assert len(used) <= 8 and backend.rows.table.shape[0] == 8 and backend.rows.row_of == {}


@pytest.mark.parametrize("admission", ["conservative", "small pool"])
def test_chunked_batching_on_the_real_backend_generates_what_the_slora_loop_does(admission):
    """The same engine, the real backend: greedy requests served by vLLM's step rule (prompts in chunks
    of a 24-token budget beside decodes, in mixed steps; with a small pool, preempted by recompute)
    produce the tokens S-LoRA's loop produces (whose tokens tests/real/test_model.py holds against
    transformers), and leave the pool clean."""

    def requests():
        return [request(prompt(9 + 7 * (i % 4), i), 5 + 2 * (i % 3), client="ab"[i % 2]) for i in range(8)]

    reference = requests()
    real_engine(tiny_backend(pool=600), pool=600).run(reference)
    pool = 600 if admission == "conservative" else 96
    chunked = requests()
    engine = real_engine(tiny_backend(pool=pool), pool=pool, scheduler="vtc", batching="chunked",
                         max_num_batched_tokens=24, max_num_seqs=4, block_size=8)  # fmt: skip
    steps, mixed = [], engine.backend.mixed

    def mixed_step(chunks, decodes):
        steps.append(bool(chunks) and bool(decodes))
        return mixed(chunks, decodes)

    engine.backend.mixed = mixed_step
    engine.run(chunked)
    assert any(steps)  # some steps computed a chunk and decodes together
    assert (sum(r.preemptions for r in chunked) > 0) == (admission == "small pool")
    assert [r.output_ids for r in chunked] == [r.output_ids for r in reference]
    assert all(r.state is State.FINISHED for r in chunked)
    assert_clean(engine, chunked)
