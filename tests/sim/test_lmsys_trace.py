"""The paper's LMSYS trace on the simulator: the real-trace claims, and the replay / trace CLI."""

import pytest

from slora_vtc import metrics
from slora_vtc.cli import main
from slora_vtc.experiment import Experiment
from slora_vtc.results import read_results
from slora_vtc.runner import run_experiment
from tests.helpers.files import ARENA_FIXTURE, lmsys_trace

FIXTURE = str(ARENA_FIXTURE)


@pytest.fixture(scope="module")
def real():
    lmsys_trace()
    return {s: run_experiment(Experiment.of(suite="real", scheduler=s)) for s in ("vtc", "fcfs", "lcf", "rpm:5")}


def test_rpm5_rejects_requests_and_loses_throughput(real):
    rpm, vtc = real["rpm:5"], real["vtc"]
    assert rpm.count("rejected") > 0
    assert rpm.count("finished") + rpm.count("rejected") == len(rpm.responses) == 1500
    assert metrics.throughput(rpm) < 0.6 * metrics.throughput(vtc)


def test_vtc_average_service_difference_is_below_fcfs_and_lcf(real):
    avg = {s: metrics.fairness_summary(r, 600).avg for s, r in real.items()}
    assert avg["vtc"] < avg["fcfs"] and avg["vtc"] < avg["lcf"]


def test_replay_and_trace_build_from_the_command_line(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    assert main(["trace", "build", FIXTURE, "--rate", "0.1", "--duration", "300", "--out", str(trace)]) == 0
    assert "30 requests from" in capsys.readouterr().out
    out = tmp_path / "result.jsonl"
    assert main(["replay", str(trace), "--scheduler", "vtc", "--out", str(out)]) == 0
    [result] = read_results(out)
    assert len(result.responses) == 30 and result.config["trace"] == str(trace)


def test_missing_trace_tells_how_to_get_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLORA_VTC_DATA", str(tmp_path))
    assert main(["run", "--suite", "real", "--scheduler", "vtc"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "slora-vtc trace build" in err and "--trace FILE" in err


def test_bad_trace_file_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"client": "a", "prompt_len": 3, "output_len": 4}\n')
    assert main(["replay", str(bad), "--scheduler", "vtc"]) == 2
    assert "bad.jsonl:1: missing field 'req_time'" in capsys.readouterr().err
