"""The command line: results on good input, one-line errors (exit status 2) on bad input."""

import subprocess
import sys

import pytest

from slora_vtc.results import read_results
from slora_vtc.sched import SCHEDULERS
from slora_vtc.suites import SUITES
from tests.helpers.cli import assert_one_line_error, cli, run_cli
from tests.helpers.files import REPO


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--suite", "nope", "--scheduler", "vtc"], "unknown suite 'nope'"),
        (["run", "--suite", "overload", "--scheduler", "nope", "--duration", "10"], "unknown scheduler 'nope'"),
        (["run", "--suite", "overload", "--scheduler", "rpm:abc", "--duration", "10"], "'abc' is not an integer"),
        (["run", "--suite", "overload", "--scheduler", "wvtc:1,0", "--duration", "10"], "weights must be positive"),
        (["run", "--suite", "overload", "--scheduler", "wvtc:-1,2", "--duration", "10"], "weights must be positive"),
        (["run", "--suite", "overload", "--scheduler", "vtc", "--pool-tokens", "300"], "cannot hold a single request"),
        (["run", "--suite", "overload", "--scheduler", "vtc", "--pool-tokens", "0"], "must be positive"),
        (["run", "--suite", "overload", "--scheduler", "vtc", "--duration", "-5"], "duration must be positive"),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--duration", "nan"],
            "duration must be positive and finite",
        ),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--duration", "inf"],
            "duration must be positive and finite",
        ),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--duration", "1e9"],
            "suite 'overload' over 1e+09 s would send about 4,500,000,000 requests",
        ),
        (
            ["run", "--suite", "real", "--scheduler", "vtc", "--duration", "nan"],
            "duration must be positive and finite, got nan",
        ),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--duration", "5", "--jitter-ms", "inf"],
            "--jitter-ms must be a finite number >= 0, got inf",
        ),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--duration", "5", "--horizon", "nan"],
            "--horizon must be positive and finite, got nan",
        ),
        (["compare", "--suite", "overload", "--schedulers", "rpm:0,vtc", "--duration", "10"], "must be positive"),
        (["compare", "--suite", "overload", "--schedulers", "vtc,rpm:0", "--duration", "10"], "must be positive"),
        (["run", "--suite", "prefix_qa", "--scheduler", "dlpm:0", "--duration", "5"], "quantum must be positive"),
        (["run", "--suite", "prefix_qa", "--scheduler", "dlpm:-5", "--duration", "5"], "quantum must be positive"),
        (["run", "--suite", "prefix_qa", "--scheduler", "dlpm:x", "--duration", "5"], "'x' is not a number"),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--charge-cached", "1.5", "--duration", "5"],
            "--charge-cached must be in [0, 1], got 1.5",
        ),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--charge-cached", "-0.1", "--duration", "5"],
            "--charge-cached must be in [0, 1]",
        ),
        (
            [
                "run",
                "--suite",
                "real",
                "--scheduler",
                "vtc",
                "--admission",
                "optimistic",
                "--pool-tokens",
                "1000",
                "--duration",
                "60",
            ],
            "--admission optimistic: a pool of 1000 tokens is too small for one request",
        ),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--horizon", "0", "--duration", "5"],
            "--horizon must be positive",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)  # a run would write results/ here
    code, out, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["{broken", '{"8": {"1": [1, 0.1]}}'])
@pytest.mark.parametrize("cost", ["linear", "profile"])
def test_profile_that_does_not_parse(capsys, tmp_path, text, cost):
    profile = tmp_path / "profile.json"
    profile.write_text(text)
    code, _, err = run_cli(
        capsys,
        "run",
        "--suite",
        "overload",
        "--scheduler",
        "vtc",
        "--duration",
        "10",
        "--cost",
        cost,
        "--profile",
        str(profile),
        "--out",
        str(tmp_path / "r.jsonl"),
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and str(profile) in err and "Traceback" not in err


def test_run_writes_a_result_file(capsys, tmp_path):
    out_file = tmp_path / "out" / "vtc.jsonl"
    code, out, _ = run_cli(
        capsys, "run", "--suite", "overload", "--scheduler", "vtc", "--duration", "60", "--out", str(out_file)
    )
    assert code == 0
    assert f"wrote {out_file}" in out
    (result,) = read_results(out_file)
    assert result.config["suite"] == "overload" and result.config["scheduler"] == "vtc"
    assert result.config["duration"] == 60 and result.config["pool_tokens"] == 10_000
    assert len(result.responses) == int(1.5 * 60) + int(3 * 60)
    assert result.count("finished") == len(result.responses)
    assert result.clients == ["client0", "client1"]


def table_rows(out: str) -> list[list[str]]:
    """The summary table's rows (after its header line), as words."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["scheduler"])
    end = next(i for i, line in enumerate(lines) if line.startswith("diff:"))
    return [line.split() for line in lines[start + 1 : end]]


def test_compare_prints_a_row_per_scheduler(capsys):
    code, out, _ = run_cli(
        capsys, "compare", "--suite", "overload", "--schedulers", "vtc,fcfs,rpm:30", "--duration", "60"
    )
    assert code == 0
    assert "overload, arrivals over 60 s" in out and "tok/s" in out and "time to first token" in out
    assert [row[0] for row in table_rows(out)] == ["vtc", "fcfs", "rpm:30"]


def test_list_names_every_suite_and_scheduler(capsys):
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    words = set(out.replace(":", " ").split())
    assert set(SUITES) <= words
    assert set(SCHEDULERS) <= words


@pytest.mark.slow
def test_python_dash_m_list():
    proc = cli("list", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "overload" in proc.stdout and "vtc" in proc.stdout


@pytest.mark.slow
def test_python_dash_m_bad_suite():
    proc = cli("run", "--suite", "nope", "--scheduler", "vtc", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "slora-vtc: error: unknown suite 'nope' (known: " + ", ".join(SUITES) + ")"
    ]


def test_missing_real_engine_package_is_a_one_line_error(capsys, monkeypatch):
    import slora_vtc.cli.experiments as experiments

    def without_torch(args):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(experiments, "cmd_run", without_torch)
    code, _, err = run_cli(capsys, "run", "--suite", "overload", "--scheduler", "vtc")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "torch is missing" in err and "requirements-real.txt" in err


# -- what a new user hit (issue: stand alone) ------------------------------------------------------
def test_compare_takes_specs_separated_by_spaces_even_with_commas_inside(capsys):
    code, out, err = run_cli(
        capsys,
        "compare",
        "--suite",
        "overload_weighted",
        "--schedulers",
        "vtc",
        "fcfs",
        "wvtc:1,2,3,4",
        "--duration",
        "30",
    )
    assert code == 0, err
    assert [row[0] for row in table_rows(out)] == ["vtc", "fcfs", "wvtc:1,2,3,4"]
    code, out, _ = run_cli(
        capsys, "compare", "--suite", "overload_weighted", "--schedulers", "vtc,wvtc:1,2,3,4", "--duration", "30"
    )
    assert code == 0 and [row[0] for row in table_rows(out)] == ["vtc", "wvtc:1,2,3,4"]


def test_the_weighted_scheduler_row_reports_the_weighted_difference(capsys):
    from slora_vtc import metrics
    from slora_vtc.experiment import Experiment
    from slora_vtc.runner import run_experiment

    code, out, _ = run_cli(
        capsys, "compare", "--suite", "overload_weighted", "--schedulers", "wvtc:1,2,3,4", "--duration", "120"
    )
    result = run_experiment(Experiment.of(suite="overload_weighted", scheduler="wvtc:1,2,3,4", duration=120))
    weighted = metrics.fairness_summary(result, 120, weights={f"client{i}": i + 1.0 for i in range(4)})
    plain = metrics.fairness_summary(result, 120)
    (row,) = table_rows(out)
    assert float(row[2]) == pytest.approx(weighted.avg, abs=0.05) and abs(weighted.avg - plain.avg) > 10
    assert "service / weight" in out


def test_tables_fit_80_columns_and_name_their_units(capsys):
    code, out, _ = run_cli(
        capsys, "compare", "--suite", "overload", "--schedulers", "vtc", "vtc-pred:0.5", "wvtc:1,2", "--duration", "30"
    )
    assert code == 0
    assert max(len(line) for line in out.splitlines() if not line.startswith("wrote")) <= 80
    assert "arrivals over 30 s" in out and "pool 10000 tokens" in out
    assert "time to first token" in out and "service/s" in out and "tokens served per second" in out


@pytest.mark.slow
def test_list_piped_into_head_is_not_an_error():
    proc = subprocess.run(
        f"{sys.executable} -m slora_vtc list | head -2",
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stderr == "" and len(proc.stdout.splitlines()) == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--trace", "t.jsonl"],
            "--trace applies only to trace suites",
        ),
        (["replay", ".", "--scheduler", "vtc"], "is a directory; replay takes a trace file"),
        (["calibrate", "--measured", "empty.jsonl"], "empty.jsonl: no run in this result file (it is empty)"),
        (["run", "--suite", "overload", "--scheduler", "vtc", "--testbed", "nope"], "unknown testbed 'nope'"),
        (
            ["run", "--suite", "overload", "--scheduler", "vtc", "--backend", "torch", "--testbed", "a10g-2023"],
            "--testbed applies to the simulator",
        ),
    ],
)
def test_silent_or_crashing_input_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    code, _, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_a_figure_whose_data_is_missing_is_an_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SLORA_VTC_DATA", str(tmp_path))
    code, _, err = run_cli(capsys, "figures", "--only", "cost_profile", "--out", str(tmp_path / "figs"))
    assert code == 2 and "profiles/a10g_llama7b.json is missing" in err and len(err.strip().splitlines()) == 1


def test_result_files_are_named_after_what_differs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "mine.jsonl"
    trace.write_text('{"client": "a", "prompt_len": 10, "output_len": 5, "req_time": 0}\n')
    runs = [
        ("run", "--suite", "overload", "--scheduler", "vtc", "--duration", "20"),
        ("run", "--suite", "overload", "--scheduler", "vtc", "--duration", "20", "--cost", "profile"),
        ("run", "--suite", "overload", "--scheduler", "wvtc:1,2", "--duration", "20", "--testbed", "a10g-2023"),
        ("replay", str(trace), "--scheduler", "vtc"),
    ]
    for argv in runs:
        assert run_cli(capsys, *argv)[0] == 0
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "overload_vtc_duration-20.0.jsonl",
        "overload_vtc_duration-20.0_cost-profile.jsonl",
        "overload_wvtc-1_2_duration-20.0_testbed-a10g-2023.jsonl",
        "replay-mine_vtc.jsonl",
    ]


def test_a_prefix_cache_run_records_its_cached_tokens(capsys, tmp_path):
    out = tmp_path / "r.jsonl"
    code, _, _ = run_cli(
        capsys,
        "run",
        "--suite",
        "prefix_qa",
        "--scheduler",
        "dlpm:8000",
        "--prefix-cache",
        "on",
        "--duration",
        "20",
        "--horizon",
        "20",
        "--out",
        str(out),
    )
    assert code == 0
    (result,) = read_results(out)
    assert result.config["prefix_cache"] is True and result.config["horizon"] == 20
    finished = [r for r in result.responses if r.status == "finished"]
    # 16 questions per document: all but the first of each reuse it (and every prompt shares its client's BOS)
    assert sum(r.cached_tokens > 0 for r in finished) > len(finished) / 2
    assert all(r.status in ("finished", "aborted") for r in result.responses)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--out", "FOLDER"], "is a folder; --out takes a result file"),
        (["run", "--out", "FILE/r.jsonl"], "cannot write a result file there (FILE is not a folder"),
        (["compare", "--out", "FOLDER"], "is a folder; --out takes a result file"),
    ],
)
def test_a_result_file_that_cannot_be_written_fails_before_the_run(capsys, tmp_path, monkeypatch, argv, message):
    """Checked before the run, which could take hours, not after it: one line, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "FILE").write_text("")
    command, flags = argv[0], argv[1:]
    schedulers = ["--scheduler", "vtc"] if command == "run" else ["--schedulers", "vtc", "fcfs"]
    ran = []
    monkeypatch.setattr("slora_vtc.cli.experiments.run_experiment", lambda *a, **k: ran.append(a))
    code, _, err = run_cli(capsys, command, "--suite", "overload", *schedulers, "--duration", "5", *flags)
    assert_one_line_error(code, err, message)
    assert ran == [] and sorted(p.name for p in tmp_path.iterdir()) == ["FILE", "FOLDER"]


def test_any_output_that_cannot_be_written_is_one_line(capsys, tmp_path):
    """Where a command finds out only as it writes (here `figures --out` on a file): the file and the
    system's reason in one line, exit 2."""
    taken = tmp_path / "taken"
    taken.write_text("")
    code, _, err = run_cli(capsys, "figures", "--out", taken)
    assert_one_line_error(code, err, str(taken), "File exists")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["figures", "--only", ""], "--only takes comma-separated figure names (see `slora-vtc list`), got ''"),
        (["figures", "--only", "overload,,weighted"], "got 'overload,,weighted'"),
        (["figures", "--jobs", "-1"], "--jobs must not be negative (0: one per core), got -1"),
    ],
)
def test_figures_refuses_an_empty_name_or_negative_jobs_before_running_anything(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, *argv, "--out", tmp_path / "figs")
    assert_one_line_error(code, err, message)
    assert not (tmp_path / "figs").exists()
