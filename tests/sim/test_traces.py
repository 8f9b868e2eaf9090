"""Trace readers, the restricted unpickler, and the Chatbot Arena pipeline on the repo's fixture."""

import pickle
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from slora_vtc.errors import UserError
from slora_vtc.traces import read_trace, trace_workload, write_trace
from slora_vtc.traces.build import MAX_LEN, build_trace, chats, load_raw
from slora_vtc.traces.tokenize import approx_count
from slora_vtc.workload import RequestSpec
from tests.helpers.files import ARENA_FIXTURE, lmsys_trace, write_jsonl

FIXTURE = ARENA_FIXTURE


def words(n: int) -> str:
    return " ".join(["the"] * n)


def chat(model: str, prompt: str, reply: str, tstamp: float, **extra) -> dict:
    return {
        "model": model,
        "conversation": [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}],
        "tstamp": tstamp,
        **extra,
    }


# -- the pipeline ---------------------------------------------------------------------------


def test_fixture_pipeline_drops_multi_turn_and_over_long_and_counts_clients():
    raw = load_raw(FIXTURE)
    sides = chats(str(FIXTURE), raw)
    pairwise = sum("model_a" in r for r in raw)
    assert len(sides) == len(raw) + pairwise  # a pairwise record is two conversations
    multi_turn = sum(1 + ("model_a" in r) for i, r in enumerate(raw) if i % 7 == 3)
    assert sides.count(None) == multi_turn
    records, stats = build_trace(str(FIXTURE), rate=0.1, duration=600, count_tokens=approx_count)
    assert stats.single_turn == len(sides) - multi_turn
    assert stats.too_long >= 1 and stats.sampled == 60 == len(records)
    assert all(r.prompt_len < MAX_LEN and r.output_len < MAX_LEN for r in records)
    assert stats.clients == len({r.client for r in records}) == 5


def test_timestamps_are_rescaled_onto_the_duration_in_order():
    records, _ = build_trace(str(FIXTURE), rate=0.05, duration=300, count_tokens=approx_count)
    times = [r.arrival for r in records]
    assert times[0] == 0.0 and times[-1] == pytest.approx(300.0)
    assert times == sorted(times)


def test_sampling_is_deterministic_under_a_seed():
    def build(seed):
        return build_trace(str(FIXTURE), rate=0.05, duration=600, count_tokens=approx_count, seed=seed)[0]

    assert build(42) == build(42)
    assert build(42) != build(1)


def test_lengths_come_from_the_tokenizer_plus_bos_or_from_given_counts(tmp_path):
    raw = write_jsonl(
        tmp_path / "raw.jsonl",
        [
            chat("a", words(10), words(20), 100.0),
            chat("b", words(3), words(4), 200.0, prompt_tokens=7, output_tokens=9),
            chat("a", words(5), words(1100), 300.0),  # output >= 1024 tokens: dropped
        ],
    )
    records, stats = build_trace(str(raw), rate=1, duration=10, count_tokens=approx_count)
    assert stats.too_long == 1
    assert records == [RequestSpec("a", 11, 20, 0.0), RequestSpec("b", 7, 9, 10.0)]


def test_parquet_input(tmp_path):
    path = tmp_path / "raw.parquet"
    pd.DataFrame(load_raw(FIXTURE)).to_parquet(path)
    assert build_trace(str(path), 0.05, 600, approx_count)[0] == build_trace(str(FIXTURE), 0.05, 600, approx_count)[0]


def test_record_without_timestamp_is_named(tmp_path):
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"model": "a", "conversation": []}])
    with pytest.raises(UserError, match="record 1: missing field 'tstamp'"):
        build_trace(str(raw), 1, 10, approx_count)


# -- readers --------------------------------------------------------------------------------

RECORDS = [RequestSpec("a", 10, 5, 0.0), RequestSpec("b", 3, 7, 1.5)]


@pytest.mark.parametrize("name", ["t.jsonl", "t.csv"])
def test_round_trip(tmp_path, name):
    write_trace(RECORDS, tmp_path / name)
    assert read_trace(tmp_path / name) == RECORDS


def test_paper_trace_json():
    records = read_trace(lmsys_trace())
    assert len(records) == 1500 and len({r.client for r in records}) == 27
    workload = trace_workload("real", records)
    assert workload.duration == 600.0 and len(workload.clients) == 27


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"client": "a", "prompt_len": 3, "req_time": 1}', "t.jsonl:2: missing field 'output_len'"),
        (
            '{"client": "a", "prompt_len": -3, "output_len": 4, "req_time": 1}',
            "t.jsonl:2: field 'prompt_len' must be positive",
        ),
        (
            '{"client": "a", "prompt_len": 3, "output_len": 4, "req_time": "soon"}',
            "t.jsonl:2: field 'req_time' is not a number",
        ),
        (
            '{"client": "a", "prompt_len": 3, "output_len": 4.5, "req_time": 1}',
            "t.jsonl:2: field 'output_len' is not a whole number",
        ),
        (
            '{"client": "a", "prompt_len": 3, "output_len": 4, "req_time": 0.5}',
            "t.jsonl:2: field 'req_time' goes back in time",
        ),
        ('{"client": "a", "prompt_len": 3', "t.jsonl:2: not valid JSON"),
        (
            '{"client": "a", "prompt_len": true, "output_len": 4, "req_time": 1}',
            "t.jsonl:2: field 'prompt_len' must be a whole number, got a boolean (true)",
        ),
        (
            '{"client": "a", "prompt_len": 3, "output_len": false, "req_time": 1}',
            "t.jsonl:2: field 'output_len' must be a whole number, got a boolean (false)",
        ),
        (
            '{"client": "a", "prompt_len": 3, "output_len": 4, "req_time": true}',
            "t.jsonl:2: field 'req_time' must be a number, got a boolean (true)",
        ),
        (
            '{"client": [1], "prompt_len": 3, "output_len": 4, "req_time": 1}',
            "t.jsonl:2: field 'client' must be a string, got a list: [1]",
        ),
        (
            '{"client": 7, "prompt_len": 3, "output_len": 4, "req_time": 1}',
            "t.jsonl:2: field 'client' must be a string, got a number: 7",
        ),
    ],
)
def test_malformed_jsonl_rows_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"client": "a", "prompt_len": 3, "output_len": 4, "req_time": 1}\n' + line + "\n")
    with pytest.raises(UserError) as err:
        read_trace(path)
    assert message in str(err.value)


def test_malformed_csv_row_names_its_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("client,prompt_len,output_len,req_time\na,3,4,0\nb,3,x,1\n")
    with pytest.raises(UserError, match=r"t.csv:3: field 'output_len' is not a whole number"):
        read_trace(path)


# -- the artifact's pickle ------------------------------------------------------------------


@pytest.fixture
def artifact_module(monkeypatch):
    """A stand-in for the artifact's `trace` module and its Request record."""
    module = types.ModuleType("trace")

    class Request:
        def __init__(self, req_id, adapter_dir, prompt_len, output_len, req_time):
            self.req_id, self.adapter_dir = req_id, adapter_dir
            self.prompt, self.prompt_len, self.output_len, self.req_time = (
                "Hello " * prompt_len,
                prompt_len,
                output_len,
                req_time,
            )

    Request.__module__, Request.__qualname__ = "trace", "Request"
    module.Request = Request
    monkeypatch.setitem(sys.modules, "trace", module)
    return module


def test_restricted_unpickler_reads_the_artifacts_records(tmp_path, artifact_module):
    path = tmp_path / "real_trace.pkl"
    reqs = [artifact_module.Request(0, "lora-0", 13, 199, 0.0), artifact_module.Request(1, "lora-2", 36, 137, 0.2)]
    path.write_bytes(pickle.dumps(reqs))
    assert read_trace(path) == [RequestSpec("lora-0", 13, 199, 0.0), RequestSpec("lora-2", 36, 137, 0.2)]


class Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_restricted_unpickler_refuses_any_other_global_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps([Exploit(marker)]))
    with pytest.raises(UserError, match="refusing global 'pathlib"):
        read_trace(path)
    assert not marker.exists()
    assert pickle.loads(path.read_bytes()) and marker.exists()  # the default unpickler would have run it
