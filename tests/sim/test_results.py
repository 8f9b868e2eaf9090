"""Result files (docs/design.md, "Result files") and cost-profile files: round trips and clear errors."""

import json
from pathlib import Path

import pytest

from slora_vtc.errors import UserError
from slora_vtc.profile import ProfilePoint, load_profile, save_profile
from slora_vtc.results import RunResult, read_results, write_results
from slora_vtc.sched import RPM
from tests.helpers.cli import assert_one_line_error, run_cli
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
        ({"result": {"total_time": "soon", "responses": []}}, "field 'total_time' is not a number"),
        ({"result": {"total_time": 1.0, "responses": [5]}}, "expected"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, "", line])
    with pytest.raises(UserError, match=message) as err:
        read_results(path)
    assert f"{path}:3" in str(err.value)


def bad_run(**change) -> dict:
    record = json.loads(json.dumps(GOOD))
    record["result"].update(change)
    return record


@pytest.mark.parametrize(
    "line, message",
    [
        (bad_run(responses="x"), "field 'responses' must be a list of responses, got a string ('x')"),
        (bad_run(responses={"a": 1}), "field 'responses' must be a list of responses, got an object"),
        (bad_run(total_time=-1), "field 'total_time' must be a time >= 0 s, got -1"),
        (bad_run(total_time=float("inf")), "field 'total_time' must be a finite number, got inf"),
        ({**GOOD, "config": [1]}, "field 'config' must be an object, got a list"),
        (bad_response(req_time=float("nan")), "response 0: field 'req_time' must be a finite number, got nan"),
        (bad_response(req_time=-0.5), "response 0: field 'req_time' must be a time >= 0 s, got -0.5"),
        (bad_response(prompt_len=-5), "response 0: field 'prompt_len' must be >= 0, got -5"),
        (bad_response(output_len=2.5), "response 0: field 'output_len' must be a whole number, got 2.5"),
        (bad_response(prompt_len=True), "response 0: field 'prompt_len' is not a number, got a boolean (true)"),
        (bad_response(client=[1]), "response 0: field 'client' must be a string, got a list"),
        (
            bad_response(request_latency=float("inf")),
            "response 0: field 'request_latency' must be a finite number, got inf",
        ),
        (
            bad_response(first_token_latency=-0.5),
            "response 0: field 'first_token_latency' must be a time >= 0 s (or -1: never served), got -0.5",
        ),
        (
            bad_response(first_token_latency=-1),
            "response 0: fields 'first_token_latency' (-1) and 'request_latency' (1) disagree: "
            "both are -1 for a request never served, else both times >= 0 s",
        ),
        (
            bad_response(first_token_latency=-1, request_latency=-1, status="finished"),
            "response 0: field 'status' is 'finished', but its latencies are -1 (never served)",
        ),
        (
            bad_response(status="done"),
            "response 0: field 'status' must be one of waiting, running, finished, rejected, aborted, "
            "got a string ('done')",
        ),
        (bad_response(preemptions=-2), "response 0: field 'preemptions' must be >= 0, got -2"),
        (bad_response(replica=-2), "response 0: field 'replica' must be >= -1, got -2"),
    ],
)
def test_numbers_that_make_no_sense_name_file_line_and_field(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, line])
    with pytest.raises(UserError) as err:
        read_results(path)
    assert str(err.value) == f"{path}:2: {message}"


def test_every_shipped_result_file_reads(paper_results):
    for name in ("vtc_overload.jsonl", "fcfs_overload.jsonl"):
        (run,) = read_results(paper_results(name))
        assert run.responses and all(r.prompt_len >= 0 and r.req_time >= 0 for r in run.responses)


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


# -- calibrate --measured on a bad result file: one line, exit 2 ------------------------------


def _measured(paper_results, tmp_path, change) -> Path:
    """A copy of the artifact's VTC overload run with one change."""
    record = json.loads(paper_results("vtc_overload.jsonl").read_text().splitlines()[0])
    change(record["result"])
    path = tmp_path / "measured.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def _set_first_response(**fields):
    return lambda result: result["responses"][0].update(fields)


def _all_refused(result):
    for r in result["responses"]:
        r["first_token_latency"] = r["request_latency"] = -1


def _short(result):
    result["responses"] = [r for r in result["responses"] if r["req_time"] < 20]
    result["total_time"] = 40.0


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda r: r.update(responses=[]),
            "{path}: the first run has no responses (field 'responses' is []); a measured run's requests are needed",
        ),
        (
            lambda r: r.update(responses="x"),
            "{path}:1: field 'responses' must be a list of responses, got a string ('x')",
        ),
        (
            _set_first_response(req_time=float("nan")),
            "{path}:1: response 0: field 'req_time' must be a finite number, got nan",
        ),
        (_set_first_response(prompt_len=-5), "{path}:1: response 0: field 'prompt_len' must be >= 0, got -5"),
        (
            _set_first_response(first_token_latency=-1),
            "{path}:1: response 0: fields 'first_token_latency' (-1) and 'request_latency' (12.353665351867676) "
            "disagree: both are -1 for a request never served, else both times >= 0 s",
        ),
        (
            _set_first_response(request_latency=float("inf")),
            "{path}:1: response 0: field 'request_latency' must be a finite number, got inf",
        ),
        (_all_refused, "{path}: the first run served no request (none of its 1620 responses finished)"),
        (lambda r: r.update(total_time=0), "{path}: the first run's field 'total_time' must be positive, got 0.0"),
        (
            _short,
            "the run to calibrate on (the first --measured) lasted 40 s; its steady state, from 100 s to 0.8 x its "
            "total_time, is empty: give a run longer than 125 s (or --testbed)",
        ),
    ],
)
def test_calibrate_from_a_bad_measured_run_is_one_line(capsys, tmp_path, paper_results, change, message):
    path = _measured(paper_results, tmp_path, change)
    code, _, err = run_cli(capsys, "calibrate", "--measured", path, "--scheduler", "vtc")
    assert_one_line_error(code, err, message.format(path=path))


def test_calibrate_with_a_bad_config_duration_is_one_line(capsys, tmp_path, paper_results):
    record = json.loads(paper_results("vtc_overload.jsonl").read_text().splitlines()[0])
    record["config"]["duration"] = "x"
    path = write_jsonl(tmp_path / "measured.jsonl", [record])
    code, _, err = run_cli(capsys, "calibrate", "--measured", path, "--scheduler", "vtc")
    assert_one_line_error(
        code, err, f"{path}: the first run's field 'config.duration' must be a positive number of seconds, got 'x'"
    )
