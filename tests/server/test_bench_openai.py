"""`slora-vtc bench-http --api openai`: a trace's clients replayed as tenants against /v1/completions
of our own `serve` (the tiny model), checked against the trace and against what the server counted."""

import json

import pytest

from slora_vtc.cli import main
from slora_vtc.results import read_results
from slora_vtc.server.bench_openai import PROMPT_TOKENS, prompt_ids
from tests.helpers.server import free_port, running_server

POOL = 1000
# (client, prompt_len, output_len, send time): three tenants, lengths that differ by tenant and request
ROWS = [
    ("alice", 12, 6, 0.00),
    ("bob", 30, 3, 0.02),
    ("carol", 5, 9, 0.04),
    ("alice", 20, 4, 0.06),
    ("bob", 7, 8, 0.08),
    ("alice", 9, 5, 0.10),
    ("carol", 16, 2, 0.12),
    ("bob", 11, 7, 0.14),
]


def write_trace(path, rows):
    keys = ("client", "prompt_len", "output_len", "req_time")
    path.write_text("".join(json.dumps(dict(zip(keys, r))) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def server():
    with running_server(pool_tokens=POOL, scheduler="vtc") as srv:
        yield srv


def bench(trace, url, out, *extra):
    return main(["bench-http", trace, "--url", url, "--api", "openai", "--out", str(out), *extra])


def test_replays_every_tenant_and_records_what_the_trace_asked(server, tmp_path, capsys):
    before_in = server.per_client("served_input_tokens_total")
    before_out = server.per_client("served_output_tokens_total")
    out = tmp_path / "r.jsonl"
    assert bench(write_trace(tmp_path / "t.jsonl", ROWS), server.url, out) == 0
    server.wait_idle()
    (result,) = read_results(out)
    assert result.config["api"] == "openai" and result.config["scheduler"] == "vtc"
    assert result.config["model"] == "tiny" and result.config["pool_tokens"] == POOL
    assert [r.status for r in result.responses] == ["finished"] * len(ROWS)
    for resp, (client, prompt, output, sent) in zip(result.responses, ROWS):
        assert (resp.client, resp.prompt_len, resp.output_len, resp.req_time) == (client, prompt, output, sent)
        assert 0 < resp.first_token_latency <= resp.request_latency
    # worked out from ROWS by hand: prompt + 2 x output per request
    service = {"alice": (12 + 12) + (20 + 8) + (9 + 10), "bob": (30 + 6) + (7 + 16) + (11 + 14), "carol": 23 + 20}
    counts = {"alice": 3, "bob": 3, "carol": 2}
    # the server counted each tenant's tokens under its X-Client-Id: the prompts were token-id lists of
    # the trace's lengths, and ignore_eos made every output exactly max_tokens long
    got_in = server.per_client("served_input_tokens_total")
    got_out = server.per_client("served_output_tokens_total")
    for client in counts:
        ins = sum(r[1] for r in ROWS if r[0] == client)
        outs = sum(r[2] for r in ROWS if r[0] == client)
        assert got_in[client] - before_in.get(client, 0) == ins
        assert got_out[client] - before_out.get(client, 0) == outs
    printed = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()
        for line in printed.splitlines()
        if line.split()[:1] in (["alice"], ["bob"], ["carol"])
    }
    for client, n in counts.items():
        assert rows[client][1] == f"{n}/{n}"
        assert float(rows[client][2]) == pytest.approx(service[client])
    jain = float(next(line for line in printed.splitlines() if line.startswith("Jain's index")).split()[-1])
    assert 1 / 3 <= jain <= 1
    assert "diff max" in printed  # the paper's fairness table


def test_a_request_the_server_can_never_fit_is_rejected_and_the_rest_served(server, tmp_path):
    rows = [("a", 8, 4, 0.0), ("b", POOL + 200, 4, 0.01), ("a", 8, 4, 0.02)]
    out = tmp_path / "r.jsonl"
    assert bench(write_trace(tmp_path / "t.jsonl", rows), server.url, out) == 0
    server.wait_idle()
    (result,) = read_results(out)
    assert [r.status for r in result.responses] == ["finished", "rejected", "finished"]
    assert result.responses[1].first_token_latency == result.responses[1].request_latency == -1


def test_the_deadline_aborts_what_is_left_and_the_server_lets_it_go(server, tmp_path, capsys):
    rows = [("a", 8, 500, 0.0), ("b", 8, 500, 0.0)]  # 500 tokens take far longer than 0.3 s here
    code = bench(write_trace(tmp_path / "t.jsonl", rows), server.url, tmp_path / "r.jsonl", "--deadline", "0.3")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "none of the 2 requests finished: 2 got the run's --deadline" in err[0]
    server.wait_idle()  # the streams closed: the server aborted both, and holds nothing


def test_the_request_timeout_aborts_a_request(server, tmp_path, capsys):
    rows = [("a", 8, 500, 0.0)]
    code = bench(write_trace(tmp_path / "t.jsonl", rows), server.url, tmp_path / "r.jsonl", "--request-timeout", "0.2")
    assert code == 2 and "no end within --request-timeout 0.2 s" in capsys.readouterr().err
    server.wait_idle()


def test_bad_input_is_one_line_and_exit_2(server, tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl", ROWS[:2])
    out = tmp_path / "r.jsonl"
    cases = [
        ([f"http://127.0.0.1:{free_port()}"], "no server answers"),
        ([server.url, "--model", "llama-9000"], "does not serve model 'llama-9000' (it serves: tiny"),
        ([server.url, "--request-timeout", "0"], "--request-timeout must be positive"),
        ([server.url, "--deadline", "-1"], "--deadline must be positive"),
    ]
    for args, message in cases:
        assert bench(trace, *args[:1], out, *args[1:]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    (tmp_path / "bad.jsonl").write_text('{"client": "a", "prompt_len": "many"}\n')
    assert bench(str(tmp_path / "bad.jsonl"), server.url, out) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["bench-http", trace, "--url", server.url, "--model", "tiny"]) == 2  # --model needs --api openai
    assert "--model is for --api openai" in capsys.readouterr().err
    assert main(["bench-http", trace, "--url", server.url, "--prompt-seed", "2"]) == 2
    assert "--prompt-seed is for --api openai" in capsys.readouterr().err
    assert not out.exists()


def test_prompts_are_the_trace_lengths_of_ordinary_tokens_and_differ_between_requests():
    prompts = [prompt_ids(i, 64) for i in range(50)]
    assert all(len(p) == 64 and set(p) <= set(PROMPT_TOKENS) for p in prompts)
    assert len({tuple(p[:16]) for p in prompts}) == 50  # no two share even a first block: no prefix-cache hit
    assert prompt_ids(7, 64) == prompts[7]  # the same prompts on every run
    others = [prompt_ids(i, 64, seed=3) for i in range(50)]  # another seed's: not one first block in common
    assert not {tuple(p[:16]) for p in prompts} & {tuple(p[:16]) for p in others}
    assert others == [prompt_ids(i, 64, seed=3) for i in range(50)]
