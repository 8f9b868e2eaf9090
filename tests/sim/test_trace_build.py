"""`slora-vtc trace build` on every input it meets: the three layouts, gzip and parquet, arrivals
without timestamps, and bad input as one-line errors (never a traceback)."""

import gzip
import json
import pickle
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from slora_vtc.cli import main
from slora_vtc.errors import UserError
from slora_vtc.results import read_results
from slora_vtc.traces import read_trace, write_trace
from slora_vtc.traces.build import build_trace
from slora_vtc.traces.tokenize import approx_count
from slora_vtc.workload import RequestSpec
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.files import ARENA_FIXTURE, write_jsonl

FIXTURE = str(ARENA_FIXTURE)


def words(n: int) -> str:
    """n tokens under the approximate count (each 'the' is one)."""
    return " ".join(["the"] * n)


def turns(*pairs: tuple[str, int], role: str = "role", text: str = "content") -> list[dict]:
    return [{role: who, text: words(n)} for who, n in pairs]


def arena(model: str, prompt: int, reply: int, **extra) -> dict:
    return {"model": model, "conversation": turns(("user", prompt), ("assistant", reply)), **extra}


def build(path: Path, *flags: str, rate: str = "1", duration: str = "10", out: Path | None = None) -> list[str]:
    out = out or path.parent / "trace.jsonl"
    return ["trace", "build", str(path), "--rate", rate, "--duration", duration, "--out", str(out), *flags]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("slora-vtc: error:") and err.count("\n") == 1 and "Traceback" not in err
    return err


# -- bad input: one line, exit 2 ------------------------------------------------------------


def _pickled(path: Path) -> None:
    path.write_bytes(pickle.dumps([arena("a", 3, 4, tstamp=1.0)]))


BAD_INPUTS = {
    "random.bin": (lambda p: p.write_bytes(np.random.RandomState(0).bytes(256)), "not a text file"),
    "image.png": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256))), "not a text file"),
    "logs.pkl": (_pickled, "is a Python pickle"),
    "pickle-named.jsonl": (_pickled, "is a Python pickle"),
    "broken.jsonl.gz": (lambda p: p.write_bytes(b"\x1f\x8b\x08\x00garbage"), "not a readable gzip file"),
    "bad-iso.jsonl": (
        lambda p: write_jsonl(p, [arena("a", 3, 4, tstamp=1.0), arena("a", 3, 4, tstamp="yesterday noon")]),
        "record 2: field 'tstamp' is not a time",
    ),
    "lists.jsonl": (lambda p: write_jsonl(p, [arena("a", 3, 4), [1, 2]]), "record 2: expected an object"),
    "list-lines.jsonl": (
        lambda p: write_jsonl(p, [["a", "b"], ["c", "d"]]),
        "record 1: expected an object (a conversation record), got a list",
    ),
    "empty.jsonl": (lambda p: p.write_text("\n"), "no records"),
    "string-turns.jsonl": (
        lambda p: write_jsonl(p, [{"model": "a", "conversation": ["hi", "yo"]}]),
        "record 1: field 'conversation' turn 1 is a string, expected an object with 'role' and 'content'",
    ),
    "not-a-list.jsonl": (
        lambda p: write_jsonl(p, [{"model": "a", "conversation": "hi"}]),
        "record 1: field 'conversation' must be a list of turns",
    ),
    "no-role.jsonl": (
        lambda p: write_jsonl(p, [{"conversations": [{"value": "hi"}]}]),
        "record 1: field 'conversations' turn 1: missing field 'from'",
    ),
    "unknown.jsonl": (lambda p: write_jsonl(p, [{"text": "hi", "id": 3}]), "record 1: no conversation field"),
    "bad-count.jsonl": (
        lambda p: write_jsonl(p, [arena("a", 3, 4, prompt_tokens="many")]),
        "record 1: field 'prompt_tokens' is not a whole number",
    ),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_input_is_one_line_naming_file_and_problem(tmp_path, capsys, name):
    write, message = BAD_INPUTS[name]
    path = tmp_path / name
    write(path)
    assert main(build(path)) == 2
    err = one_line_error(capsys)
    assert str(path) in err and message in err


def test_directory_given_as_the_file(tmp_path, capsys):
    assert main(build(tmp_path)) == 2
    assert f"{tmp_path}: is a directory" in one_line_error(capsys)


def test_out_that_cannot_be_written_is_one_line(tmp_path, capsys):
    assert main(["trace", "build", FIXTURE, "--rate", "0.1", "--duration", "300", "--out", str(tmp_path)]) == 2
    assert f"{tmp_path}: cannot write the trace" in one_line_error(capsys)


def test_zero_requests_asked_for_is_an_error_not_a_crash(capsys):
    assert main(["trace", "build", FIXTURE, "--rate", "0.01", "--duration", "10", "--out", "unused.jsonl"]) == 2
    assert "asks for 0 requests (rate 0.01 x duration 10 s)" in one_line_error(capsys)


# -- timestamps -----------------------------------------------------------------------------


@pytest.fixture
def india_time(monkeypatch):
    """A local zone 5:30 ahead of UTC, so treating naive times as local time would show."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_iso_timestamps_naive_as_utc_mixed_with_unix_times(tmp_path, india_time):
    raw = write_jsonl(
        tmp_path / "raw.jsonl",
        [
            arena("a", 3, 4, tstamp="2023-04-01T10:00:00"),  # 1680343200, naive = UTC
            arena("b", 3, 4, tstamp=1680343210),  # 10 s later
            arena("c", 3, 4, tstamp="2023-04-01T12:00:05+02:00"),  # 10:00:05 UTC: 5 s after a
        ],
    )
    records, _ = build_trace(str(raw), rate=1, duration=20, count_tokens=approx_count)
    assert [(r.client, r.arrival) for r in records] == [("a", 0.0), ("c", 10.0), ("b", 20.0)]


def test_parquet_datetime_column_is_utc_and_a_gap_in_it_is_named(tmp_path, india_time):
    conversation = turns(("user", 3), ("assistant", 4))
    frame = pd.DataFrame(
        {
            "model": ["a", "b"],
            "conversation": [conversation] * 2,
            "tstamp": pd.to_datetime(["2023-04-01T10:00:00", "2023-04-01T10:00:10"]),
        }
    )
    frame.to_parquet(tmp_path / "raw.parquet")
    records, _ = build_trace(str(tmp_path / "raw.parquet"), 1, 20, approx_count)
    assert [(r.client, r.arrival) for r in records] == [("a", 0.0), ("b", 20.0)]
    frame.assign(tstamp=pd.to_datetime(["2023-04-01T10:00:00", None])).to_parquet(tmp_path / "gap.parquet")
    with pytest.raises(UserError, match="gap.parquet: record 2: missing field 'tstamp' while record 1 has one"):
        build_trace(str(tmp_path / "gap.parquet"), 1, 20, approx_count, arrivals="auto")


def test_mixed_timestamped_and_untimestamped_records_name_the_first_without(tmp_path, capsys):
    raw = write_jsonl(
        tmp_path / "raw.jsonl",
        [arena("a", 3, 4, tstamp=1.0), arena("a", 3, 4, tstamp=2.0), arena("a", 3, 4), arena("a", 3, 4)],
    )
    assert main(build(raw)) == 2
    assert "record 3: missing field 'tstamp' while record 1 has one" in one_line_error(capsys)


def test_arrivals_timestamps_without_any_says_what_to_do(tmp_path, capsys):
    raw = write_jsonl(
        tmp_path / "lmsys.jsonl", [{"conversation_id": "x", **arena("a", 3, 4), "turn": 1, "language": "English"}]
    )
    assert main(build(raw, "--arrivals", "timestamps")) == 2
    err = one_line_error(capsys)
    assert "record 1: missing field 'tstamp'" in err and "lmsys-chat-1m" in err and "--arrivals poisson" in err


def test_arrivals_poisson_ignores_timestamps_even_unparseable_ones(tmp_path, capsys):
    raw = write_jsonl(tmp_path / "raw.jsonl", [arena("a", 3, 4, tstamp=100.0), arena("b", 3, 4, tstamp="not a time")])
    assert main(build(raw, "--arrivals", "poisson", "--seed", "3", rate="0.2")) == 0
    assert (
        "arrivals: poisson (--arrivals poisson): 2 uniform times on [0, 10] s, sorted, in record order (seed 3)"
        in capsys.readouterr().out
    )
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r.client for r in records] == ["a", "b"] and 0 < records[0].arrival < records[1].arrival < 10


def test_timestamp_rule_is_printed(tmp_path, capsys):
    assert main(build(ARENA_FIXTURE, rate="0.1", duration="300", out=tmp_path / "t.jsonl")) == 0
    assert "arrivals: timestamps (each record's time, mapped linearly onto [0, 300] s)" in capsys.readouterr().out


# -- arrivals without timestamps ------------------------------------------------------------


def lmsys(n: int) -> list[dict]:
    """n lmsys-chat-1m records (no timestamps), client i has i + 1 prompt words."""
    return [
        {"conversation_id": f"id{i}", **arena(f"c{i}", i + 1, 2), "turn": 1, "language": "English"} for i in range(n)
    ]


def test_poisson_arrivals_are_sorted_uniform_draws_after_the_sample_in_record_order(tmp_path, capsys):
    raw = write_jsonl(tmp_path / "raw.jsonl", lmsys(4))
    assert main(build(raw, "--seed", "7", rate="0.4", duration="10")) == 0
    assert "arrivals: poisson (the records have no timestamps): 4 uniform times on [0, 10] s" in capsys.readouterr().out
    # the documented rule: sample 4 of 4 (a permutation), then 4 uniform draws on [0, 10], sorted
    rng = np.random.RandomState(7)
    rng.choice(4, size=4, replace=False)
    expected = sorted(rng.uniform(0, 10, size=4))
    records = read_trace(tmp_path / "trace.jsonl")
    assert [r.client for r in records] == ["c0", "c1", "c2", "c3"]  # first record -> earliest time
    assert [r.arrival for r in records] == pytest.approx(expected)
    assert records[0].arrival > 0 and records[-1].arrival < 10  # not timestamps rescaled onto [0, 10]


def test_poisson_sample_keeps_record_order_and_depends_on_the_seed(tmp_path):
    raw = write_jsonl(tmp_path / "raw.jsonl", lmsys(12))

    def trace(seed):
        return build_trace(str(raw), 0.5, 10, approx_count, seed=seed, arrivals="auto")[0]

    records = trace(1)
    order = [int(r.client[1:]) for r in records]
    assert len(records) == 5 and order == sorted(order)
    assert [r.prompt_len for r in records] == [i + 2 for i in order]  # bos + i + 1 words
    assert [r.arrival for r in records] == sorted(r.arrival for r in records)
    assert trace(1) == records and trace(2) != records


# -- layouts --------------------------------------------------------------------------------

MIXED_LAYOUTS = [
    {"conversation_id": "l1", **arena("vicuna-13b", 3, 5), "turn": 1, "language": "English", "redacted": False},
    {"id": "s1", "conversations": turns(("human", 6), ("gpt", 7), role="from", text="value")},
    {
        "id": "s2",
        "model": "gpt-4",
        "conversations": turns(("system", 2), ("human", 3), ("gpt", 4), role="from", text="value"),
    },
    {"messages": turns(("system", 4), ("user", 2), ("assistant", 9))},
    {"id": "s3", "conversations": turns(("human", 1), ("gpt", 1), ("human", 1), ("gpt", 1), role="from", text="value")},
    {"messages": turns(("user", 2), ("system", 2), ("assistant", 2))},  # a system message mid-chat
    {
        "conversation_id": "l2",
        "model": "koala-13b",
        "conversation": turns(("user", 1), ("assistant", 1), ("user", 1), ("assistant", 1)),
        "turn": 2,
    },
    {
        "model_a": "x",
        "model_b": "y",
        "conversation_a": turns(("user", 1), ("assistant", 2)),
        "conversation_b": turns(("user", 1), ("assistant", 3)),
    },
]


def test_layouts_are_detected_per_record(tmp_path):
    raw = write_jsonl(tmp_path / "raw.jsonl", MIXED_LAYOUTS)
    records, stats = build_trace(str(raw), rate=0.6, duration=10, count_tokens=approx_count, arrivals="auto")
    assert stats.records == 8 and stats.single_turn == 6 and stats.sampled == 6 and stats.arrivals == "poisson"
    # a leading system message is part of the prompt: bos + system + user tokens
    assert [(r.client, r.prompt_len, r.output_len) for r in records] == [
        ("vicuna-13b", 4, 5),
        ("sharegpt", 7, 7),
        ("gpt-4", 6, 4),
        ("messages", 7, 9),
        ("x", 2, 2),
        ("y", 2, 3),
    ]


def test_client_field_names_the_client(tmp_path, capsys):
    def sharegpt(**who):
        return {**who, "conversations": turns(("human", 2), ("gpt", 2), role="from", text="value")}

    raw = write_jsonl(tmp_path / "raw.jsonl", [sharegpt(user="alice"), sharegpt(user="bob"), sharegpt(user=7)])
    records, _ = build_trace(str(raw), 0.3, 10, approx_count, arrivals="auto", client_field="user")
    assert [r.client for r in records] == ["alice", "bob", "7"]
    write_jsonl(raw, [sharegpt(user="alice"), sharegpt(model="gpt-4")])
    assert main(build(raw, "--client-field", "user")) == 2
    assert "record 2: missing field 'user' (named by --client-field)" in one_line_error(capsys)


# -- file formats ---------------------------------------------------------------------------


def test_gzipped_jsonl_and_json_build_the_same_trace(tmp_path):
    plain = build_trace(FIXTURE, 0.05, 600, approx_count)[0]
    text = ARENA_FIXTURE.read_text()
    (tmp_path / "raw.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    array = json.dumps([json.loads(line) for line in text.splitlines()])
    (tmp_path / "raw.json.gz").write_bytes(gzip.compress(array.encode()))
    assert build_trace(str(tmp_path / "raw.jsonl.gz"), 0.05, 600, approx_count)[0] == plain
    assert build_trace(str(tmp_path / "raw.json.gz"), 0.05, 600, approx_count)[0] == plain


def test_parquet_out_is_parquet_with_the_four_columns_and_replays(tmp_path, capsys):
    trace = tmp_path / "trace.parquet"
    assert main(["trace", "build", FIXTURE, "--rate", "0.1", "--duration", "300", "--out", str(trace)]) == 0
    assert trace.read_bytes()[:4] == b"PAR1"
    frame = pd.read_parquet(trace)
    assert list(frame.columns) == ["client", "prompt_len", "output_len", "req_time"] and len(frame) == 30
    assert read_trace(trace) == build_trace(FIXTURE, 0.1, 300, approx_count)[0]
    out = tmp_path / "result.jsonl"
    assert main(["replay", str(trace), "--scheduler", "vtc", "--out", str(out)]) == 0
    [result] = read_results(out)
    assert len(result.responses) == 30


def test_fewer_qualifying_than_asked_is_said_and_still_written(tmp_path, capsys):
    raw = write_jsonl(tmp_path / "raw.jsonl", [arena("a", 3, 4, tstamp=t) for t in (1.0, 2.0, 3.0)])
    assert main(build(raw, rate="2.5", duration="600")) == 0
    out = capsys.readouterr().out
    assert "asked for 1500 (rate 2.5 x duration 600 s), only 3 qualify" in out
    assert len(read_trace(tmp_path / "trace.jsonl")) == 3


def test_rate_times_duration_is_not_cut_by_float_error(tmp_path, capsys):
    # 0.29 * 100 is 28.999999999999996 in floating point: still 29 requests asked for
    raw = write_jsonl(tmp_path / "raw.jsonl", [arena("a", 3, 4, tstamp=float(t)) for t in range(29)])
    assert main(build(raw, rate="0.29", duration="100")) == 0
    out = capsys.readouterr().out
    assert "29 requests from 1 clients" in out and "asked for" not in out


# -- read_trace (replay) --------------------------------------------------------------------

RECORDS = [RequestSpec("a", 10, 5, 0.0), RequestSpec("b", 3, 7, 1.5)]


@pytest.mark.parametrize("name", ["t.jsonl.gz", "t.csv.gz"])
def test_read_trace_reads_gzip(tmp_path, name):
    plain = tmp_path / name.removesuffix(".gz")
    write_trace(RECORDS, plain)
    (tmp_path / name).write_bytes(gzip.compress(plain.read_bytes()))
    assert read_trace(tmp_path / name) == RECORDS


def test_read_trace_parquet_round_trip_and_missing_value(tmp_path):
    write_trace(RECORDS, tmp_path / "t.parquet")
    assert read_trace(tmp_path / "t.parquet") == RECORDS
    pd.DataFrame(
        {"client": ["a", "b"], "prompt_len": [3.0, None], "output_len": [4, 5], "req_time": [0.0, 1.0]}
    ).to_parquet(tmp_path / "gap.parquet")
    with pytest.raises(UserError, match=r"gap.parquet: request 1: missing field 'prompt_len'"):
        read_trace(tmp_path / "gap.parquet")


def test_read_trace_reads_a_pickle_whatever_its_name(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(pickle.dumps([{"client": "a", "prompt_len": 10, "output_len": 5, "req_time": 0.0}]))
    assert read_trace(path) == RECORDS[:1]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d, "is a directory"),
        (
            lambda d: (d / "t.bin").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256))) and d / "t.bin",
            "not a text file",
        ),
        (
            lambda d: (d / "t.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00xx") and d / "t.jsonl.gz",
            "not a readable gzip file",
        ),
    ],
)
def test_read_trace_bad_files_are_one_line(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(UserError) as err:
        read_trace(path)
    assert f"{path}: {message}" in str(err.value) and "\n" not in str(err.value)


def test_replay_of_a_binary_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_bytes(np.random.RandomState(0).bytes(256))
    assert main(["replay", str(path), "--scheduler", "vtc"]) == 2
    assert f"{path}: not a text file" in one_line_error(capsys)


# -- flags and --out names that replay would misread ------------------------------------------


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_a_seed_numpy_refuses_is_one_line_naming_seed(tmp_path, capsys, seed):
    code, _, err = run_cli(
        capsys, *build(Path(FIXTURE), "--seed", seed, rate="0.1", duration="300", out=tmp_path / "o.jsonl")
    )
    assert_one_line_error(code, err, f"--seed must be a whole number from 0 to 4294967295 (2**32 - 1), got {seed}")
    assert not (tmp_path / "o.jsonl").exists()


def test_the_largest_seed_builds(tmp_path, capsys):
    code, out, _ = run_cli(
        capsys, *build(Path(FIXTURE), "--seed", "4294967295", rate="0.1", duration="300", out=tmp_path / "o.jsonl")
    )
    assert code == 0 and len(read_trace(tmp_path / "o.jsonl")) == 30


@pytest.mark.parametrize("name", ["t.jsonl.gz", "t.csv.gz", "t.parquet.gz"])
def test_a_gz_out_is_gzipped_and_replays_as_written(tmp_path, capsys, name):
    out = tmp_path / name
    code, _, _ = run_cli(capsys, *build(Path(FIXTURE), rate="0.1", duration="300", out=out))
    assert code == 0 and out.read_bytes()[:2] == b"\x1f\x8b"
    assert read_trace(out) == build_trace(FIXTURE, 0.1, 300, approx_count)[0]
    code, _, _ = run_cli(capsys, "replay", out, "--scheduler", "vtc", "--out", tmp_path / "r.jsonl")
    assert code == 0 and len(read_results(tmp_path / "r.jsonl")[0].responses) == 30


@pytest.mark.parametrize(
    "name, read_as",
    [
        ("t.json", ".json is read back as the paper's JSON ({'requests': [...]})"),
        ("t.json.gz", ".json.gz is read back as the paper's JSON ({'requests': [...]})"),
        ("t.pkl", ".pkl is read back as the artifact's pickle"),
    ],
)
def test_an_out_name_replay_would_misread_is_refused_before_the_build(tmp_path, capsys, name, read_as):
    out = tmp_path / name
    code, _, err = run_cli(capsys, *build(Path(FIXTURE), rate="0.1", duration="300", out=out))
    assert_one_line_error(
        code,
        err,
        f"{out}: a trace named {read_as}, which trace build does not write; "
        "name it .jsonl, .csv or .parquet (any other name is JSONL), optionally + .gz",
    )
    assert not out.exists()


def test_replay_of_a_trace_with_a_boolean_length_names_line_and_field(tmp_path, capsys):
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"client": "a", "prompt_len": 3, "output_len": 4, "req_time": 0},
            {"client": "a", "prompt_len": True, "output_len": 4, "req_time": 1},
        ],
    )
    code, _, err = run_cli(capsys, "replay", trace, "--scheduler", "vtc", "--out", tmp_path / "r.jsonl")
    assert_one_line_error(code, err, f"{trace}:2: field 'prompt_len' must be a whole number, got a boolean (true)")
