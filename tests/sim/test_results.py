"""Result files (docs/design.md, "Result files") and cost-profile files: round trips and clear errors."""

import json

import pytest

from slora_vtc.errors import UserError
from slora_vtc.profile import ProfilePoint, load_profile, save_profile
from slora_vtc.results import RunResult, read_results, write_results
from slora_vtc.sched import RPM
from tests.helpers.engine import make_engine, req, result_of
from tests.helpers.files import a10g_profile, write_jsonl


def test_round_trip(tmp_path):
    a = result_of([("a", 10, 5, 0.0, 1.0, 2.0, "finished"), ("b", 3, 2, 0.5, -1.0, -1.0, "rejected")], 7.5)
    b = RunResult({"suite": "overload", "scheduler": "vtc", "pool_tokens": 200}, 3.0, a.responses[:1])
    path = tmp_path / "sub" / "runs.jsonl"
    write_results(path, [a])
    write_results(path, [b], append=True)
    assert read_results(path) == [a, b]
    write_results(path, [b])  # overwrite
    assert read_results(path) == [b]


def test_run_result_from_an_engine_run():
    reqs = [req("a", 10, 3, 0.0), req("a", 10, 3, 0.1), req("a", 10, 3, 0.2)]
    engine = make_engine(RPM(limit=2))
    engine.run(reqs)
    result = RunResult.of({"scheduler": "rpm:2"}, reqs, engine.clock.now())
    first, _, rejected = result.responses
    assert (first.first_token_latency, first.request_latency) == (pytest.approx(1.0), pytest.approx(1.2))
    assert (first.output_len, first.status) == (3, "finished")
    assert (rejected.status, rejected.first_token_latency, rejected.request_latency) == ("rejected", -1.0, -1.0)
    assert result.count("finished") == 2 and result.count("rejected") == 1
    line = json.loads(result.to_json())
    assert set(line) == {"config", "result"} and set(line["result"]) == {"total_time", "responses"}
    assert set(line["result"]["responses"][0]) == {
        "client",
        "prompt_len",
        "output_len",
        "req_time",
        "first_token_latency",
        "request_latency",
        "status",
    }


def test_reads_the_artifacts_files(paper_results):
    (vtc,) = read_results(paper_results("vtc_overload.jsonl"))
    assert len(vtc.responses) == 1620
    assert vtc.clients == ["dummy-lora-7b-rank-8-0", "dummy-lora-7b-rank-8-1"]  # from adapter_dir
    assert vtc.count("finished") == 1620  # no status field: served
    assert vtc.total_time == pytest.approx(928.664, abs=1e-3)
    assert vtc.config["duration"] == 360
    (fcfs,) = read_results(paper_results("fcfs_overload.jsonl"))
    assert len(fcfs.responses) == 2700


def test_an_artifact_response_never_served_reads_as_rejected(tmp_path):
    """The artifact writes no status; its RPM runs mark a refused request with latency -1."""
    served = {
        "adapter_dir": "a",
        "prompt_len": 3,
        "output_len": 2,
        "req_time": 0.0,
        "first_token_latency": 0.5,
        "request_latency": 1.0,
    }
    refused = {**served, "req_time": 0.1, "first_token_latency": -1, "request_latency": -1}
    path = write_jsonl(
        tmp_path / "artifact.jsonl", [{"config": {}, "result": {"total_time": 2.0, "responses": [served, refused]}}]
    )
    (result,) = read_results(path)
    assert [r.status for r in result.responses] == ["finished", "rejected"]
    assert result.count("finished") == 1


def test_clients_sort_numerically():
    result = result_of([(c, 1, 1, 0.0, 1.0, 1.0) for c in ("client10", "client2", "zeta", "client0")], 1.0)
    assert result.clients == ["client0", "client2", "client10", "zeta"]


GOOD = {
    "config": {},
    "result": {
        "total_time": 1.0,
        "responses": [
            {
                "client": "a",
                "prompt_len": 1,
                "output_len": 1,
                "req_time": 0,
                "first_token_latency": 0.5,
                "request_latency": 1,
            }
        ],
    },
}


def bad_response(**change):
    record = json.loads(json.dumps(GOOD))
    record["result"]["responses"][0].update(change)
    for key, value in change.items():
        if value is None:
            del record["result"]["responses"][0][key]
    return record


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ({"config": {}}, "missing field 'result'"),
        ({"result": {"responses": []}}, "missing field 'total_time'"),
        (bad_response(req_time=None), "missing field 'req_time'"),
        (bad_response(prompt_len="many"), "not a number"),
        ({"result": []}, "expected"),
        ({"result": {"total_time": "soon", "responses": []}}, "total_time is not a number"),
        ({"result": {"total_time": 1.0, "responses": [5]}}, "expected"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, "", line])
    with pytest.raises(UserError, match=message) as err:
        read_results(path)
    assert f"{path}:3" in str(err.value)


def test_missing_or_binary_result_file(tmp_path):
    with pytest.raises(UserError, match="cannot read result file"):
        read_results(tmp_path / "nope.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UserError, match="bin.jsonl"):
        read_results(tmp_path / "bin.jsonl")


# -- cost profiles ---------------------------------------------------------------------------
def test_shared_profile_loads():
    points = load_profile(a10g_profile())
    assert len(points) >= 3
    assert all(p.batch_size > 0 and p.prefill_s > 0 and p.decode_s >= 0 for p in points)


def test_profile_round_trip(tmp_path):
    points = [
        ProfilePoint(8, 1, 100, 0.002, 0.0003),
        ProfilePoint(8, 64, 90, 0.002, 0.03),
        ProfilePoint(16, 1, 80, 0.003, 0.0004),
    ]
    save_profile(points, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == points


@pytest.mark.parametrize(
    "text, message",
    [
        ("{oops", "not valid JSON"),
        ("[]", "non-empty object"),
        ("{}", "non-empty object"),
        ('{"8": [1, 2, 3]}', "entry '8' must map"),
        ('{"8": {"1": [1, 0.1, 0.1]}}', "at least 3"),
        ('{"8": {"1": [1, 0.1], "2": [1, 0.1, 0.1], "3": [1, 0.1, 0.1]}}', r"entry \[8\]\[1\]"),
        ('{"x": {"1": [1, 0.1, 0.1], "2": [1, 0.1, 0.1], "3": [1, 0.1, 0.1]}}', r"entry \[x\]\[1\]"),
        ('{"8": {"1": [0, 0.1, 0.1], "2": [1, 0.1, 0.1], "3": [1, 0.1, 0.1]}}', "must be positive"),
        ('{"8": {"1": [1, -0.1, 0.1], "2": [1, 0.1, 0.1], "3": [1, 0.1, 0.1]}}', "non-negative"),
    ],
)
def test_bad_profiles_raise_user_error(tmp_path, text, message):
    path = tmp_path / "profile.json"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_missing_profile(tmp_path):
    with pytest.raises(UserError, match="cannot read profile"):
        load_profile(tmp_path / "none.json")


def test_binary_profile_raises_user_error(tmp_path):
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(UserError, match="bin.json"):
        load_profile(tmp_path / "bin.json")
