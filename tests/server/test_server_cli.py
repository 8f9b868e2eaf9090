"""`slora-vtc serve` as a process (clean shutdown on SIGINT / SIGTERM) and `slora-vtc bench-http`."""

import json
import signal

import pytest

from slora_vtc.cli import main
from slora_vtc.results import read_results
from slora_vtc.server.bench import BenchConfig, run_bench
from tests.helpers.files import REPO
from tests.helpers.server import ENGINE_FLAGS, free_port, running_server, start_long_stream, start_server, wait_healthy


# -- bench-http ----------------------------------------------------------------------------------
def write_trace(path, rows):
    path.write_text(
        "".join(json.dumps(dict(zip(("client", "prompt_len", "output_len", "req_time"), r))) + "\n" for r in rows)
    )
    return path


def test_bench_http_replays_a_trace(tmp_path):
    rows = [(f"client{k % 2}", 8 + k, 4 + k % 3, 0.05 * k) for k in range(12)]
    rows.insert(6, ("client1", 1200, 8, 0.29))  # can never fit a pool of 1000 tokens: rejected
    trace = write_trace(tmp_path / "trace.jsonl", rows)
    out = tmp_path / "result.jsonl"
    with running_server(pool_tokens=1000, scheduler="vtc") as srv:
        assert main(["bench-http", str(trace), "--url", srv.url, "--out", str(out)]) == 0
        srv.wait_idle()
    (result,) = read_results(out)
    assert (
        result.config["scheduler"] == "vtc" and result.config["pool_tokens"] == 1000 and result.config["duration"] == 1
    )
    statuses = [r.status for r in result.responses]
    assert statuses.count("rejected") == 1 and statuses.count("finished") == 12
    for resp, (client, prompt, output, t) in zip(result.responses, rows):
        assert (resp.client, resp.prompt_len, resp.output_len, resp.req_time) == (client, prompt, output, t)
        if resp.status == "finished":
            assert 0 < resp.first_token_latency <= resp.request_latency
        else:
            assert resp.first_token_latency == resp.request_latency == -1
    assert result.total_time >= rows[-1][3]


def test_bench_http_where_every_request_fails_says_why(tmp_path, capsys):
    """The README's example server lists API keys: a replay without --clients gets 401 for every request."""
    trace = write_trace(tmp_path / "t.jsonl", [("alice", 4, 2, 0.0), ("bob", 4, 2, 0.01), ("alice", 4, 2, 0.02)])
    clients = str(REPO / "examples" / "clients.toml")
    with running_server(pool_tokens=1000, clients_file=clients, dummy_adapters=1) as srv:
        code = main(["bench-http", str(trace), "--url", srv.url, "--out", str(tmp_path / "r.jsonl")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1
        assert "none of the 3 requests finished: 3 got HTTP 401 (missing API key" in err[0]
        assert not (tmp_path / "r.jsonl").exists()
        assert (
            main(["bench-http", str(trace), "--url", srv.url, "--out", str(tmp_path / "r.jsonl"), "--clients", clients])
            == 0
        )
        srv.wait_idle()
    assert read_results(tmp_path / "r.jsonl")[0].count("finished") == 3


def test_bench_http_bad_input(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [("a", 4, 4, 0.0)])
    assert main(["bench-http", str(trace), "--url", "localhost:1"]) == 2
    with pytest.raises(Exception, match="no server answers"):
        run_bench(BenchConfig(str(trace), f"http://127.0.0.1:{free_port()}"))


def test_bench_http_progress_counts_every_request_that_ends():
    import asyncio
    import time

    from slora_vtc.progress import LazyProgress
    from slora_vtc.server.bench import _send_all
    from slora_vtc.server.bench_outcome import Outcome
    from slora_vtc.workload import RequestSpec

    class Sender:  # request 1 never ends: the request timeout aborts it
        async def send(self, rec, index, headers):
            await asyncio.sleep(10 if index == 1 else 0)
            return Outcome("finished", 0.0, 0.0, rec.output_len)

    records = [RequestSpec("a", 4, 4, 0.01 * k) for k in range(5)]
    config = BenchConfig("unused", "http://127.0.0.1:1", request_timeout_s=0.2)
    bar = LazyProgress(len(records), enabled=False)  # counts without drawing
    outcomes = asyncio.run(_send_all(Sender(), config, records, [{}] * 5, time.perf_counter(), bar))
    assert [o.status for o in outcomes] == ["finished", "aborted", "finished", "finished", "finished"]
    assert bar.count == 5


# -- serve as a process ----------------------------------------------------------------------------
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
@pytest.mark.parametrize("engine", ENGINE_FLAGS.values(), ids=ENGINE_FLAGS.keys())
@pytest.mark.slow
def test_signal_drains_then_aborts_and_exits(sig, code, engine):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # the stream needs over a second even alone on a fast CPU (tiny: ~3,000 tokens/s at batch 1),
    # far longer than the drain, so the drain must end in an abort
    proc = start_server(port, "--pool-tokens", "5000", "--drain-timeout", "0.3", *engine)
    try:
        wait_healthy(url, proc)
        reader, lines = start_long_stream(url, {"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": True})
        proc.send_signal(sig)
        reader.join(30)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    data = [line[5:].strip() for line in lines if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    assert "shutting down" in json.loads(data[-2])["error"]["message"]  # the stream ended with a final event
    assert proc.returncode == code
    assert "Traceback" not in err
