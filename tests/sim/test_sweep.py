"""`slora-vtc sweep` without Ray (--local) and `plot-sweep`: the grid's cells, the table's rows,
resuming, failed cells, and one-line errors (exit status 2) on bad grids."""

import json

import pandas as pd
import pytest

import slora_vtc.sweep.cell as cell_module
from slora_vtc.cli import main
from slora_vtc.cli.report import summary_row
from slora_vtc.experiment import Experiment
from slora_vtc.runner import run_experiment
from slora_vtc.sweep import load_grid
from slora_vtc.sweep.cell import Cell
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.files import REPO, write
from tests.helpers.sweep import assert_same_metrics

# overload: client0 sends 90 requests/min, client1 180, each 256 prompt + 256 output tokens
GRID = """
[grid]
scheduler = ["vtc", "fcfs"]
seed = [1, 2]

[fixed]
suite = "overload"
duration = 20
"""
REQUESTS_IN_20_S = 30 + 60


@pytest.fixture
def counted_runs(monkeypatch):
    """Count the runs the sweep makes (it runs cells through slora_vtc.sweep.cell.run_experiment)."""
    calls = []

    def counting(exp, *args, **kwargs):
        calls.append(exp)
        return run_experiment(exp, *args, **kwargs)

    monkeypatch.setattr(cell_module, "run_experiment", counting)
    return calls


def test_the_grid_is_the_product_of_its_lists_in_file_order(tmp_path):
    cells = load_grid(write(tmp_path, "grid.toml", GRID))
    assert [(c.settings["scheduler"], c.settings["seed"]) for c in cells] == [
        ("vtc", 1),
        ("vtc", 2),
        ("fcfs", 1),
        ("fcfs", 2),
    ]
    assert all(c.settings["suite"] == "overload" and c.settings["duration"] == 20.0 for c in cells)
    assert isinstance(cells[0].settings["duration"], float)  # duration is a float field; TOML gave an integer
    assert len({c.id for c in cells}) == 4
    assert cells[0].label == "scheduler=vtc seed=1"


def test_a_cell_id_names_the_run_not_how_the_file_spells_it(tmp_path):
    plain = Cell({"suite": "overload", "scheduler": "vtc"})
    spelt_out = Cell({"suite": "overload", "scheduler": "vtc", "seed": 42, "cost": "linear"}, ("seed",))
    assert plain.id == spelt_out.id
    assert plain.id != Cell({"suite": "overload", "scheduler": "vtc", "seed": 43}).id
    dashed = load_grid(
        write(tmp_path, "grid.toml", '[grid]\npool-tokens = [20000]\n[fixed]\nsuite = "overload"\nscheduler = "vtc"\n')
    )
    assert dashed[0].id == Cell({"suite": "overload", "scheduler": "vtc", "pool_tokens": 20000}).id


def test_a_local_sweep_writes_one_row_per_cell_with_the_runs_metrics(tmp_path, capsys, counted_runs):
    out = tmp_path / "t.parquet"
    code, stdout, _ = run_cli(capsys, "sweep", write(tmp_path, "grid.toml", GRID), "--local", "--out", out)
    assert code == 0 and "4 ok, 0 failed" in stdout and len(counted_runs) == 4
    table = pd.read_parquet(out)
    assert len(table) == 4 and set(table["status"]) == {"ok"} and set(table["error"]) == {""}
    for row in table.itertuples():
        result = run_experiment(Experiment.of(suite="overload", scheduler=row.scheduler, seed=row.seed, duration=20))
        expected = summary_row(result)  # what `slora-vtc run` prints for the same run
        assert (row.fairness_max, row.fairness_avg, row.fairness_var) == pytest.approx(
            (expected["diff max"], expected["diff avg"], expected["diff var"])
        )
        assert row.requests == REQUESTS_IN_20_S and row.finished + row.rejected + row.aborted == REQUESTS_IN_20_S
        assert row.throughput == pytest.approx(row.finished * (256 + 256) / row.total_time)
        assert set(json.loads(row.service_rates)) == {"client0", "client1"}
        assert json.loads(row.settings)["seed"] == row.seed and len(row.git_rev) in (40, len("unknown"))
        assert row.wall_s > 0 and row.cache_hit_rate == 0 and row.preemptions == 0 and row.load_imbalance == 1.0


def test_a_rerun_skips_every_finished_cell(tmp_path, capsys, counted_runs):
    grid, out = write(tmp_path, "grid.toml", GRID), tmp_path / "t.parquet"
    assert run_cli(capsys, "sweep", grid, "--local", "--out", out)[0] == 0
    first = pd.read_parquet(out)
    counted_runs.clear()
    code, stdout, stderr = run_cli(capsys, "sweep", grid, "--local", "--out", out)
    assert code == 0 and counted_runs == [] and "4 already in" in stderr and "4 skipped" in stdout
    pd.testing.assert_frame_equal(pd.read_parquet(out), first)
    # a grid grown by one axis value runs only the new cells; the old rows stay
    bigger = write(tmp_path, "grid.toml", GRID.replace('["vtc", "fcfs"]', '["vtc", "fcfs", "lcf"]'))
    assert run_cli(capsys, "sweep", bigger, "--local", "--out", out)[0] == 0
    assert [e.scheduling.scheduler for e in counted_runs] == ["lcf", "lcf"]
    assert len(pd.read_parquet(out)) == 6


def test_a_cell_that_raises_is_recorded_and_the_others_finish(tmp_path, capsys, monkeypatch):
    def fcfs_breaks(exp, *args, **kwargs):
        if exp.scheduling.scheduler == "fcfs":
            raise RuntimeError("the engine broke\nsecond line")
        return run_experiment(exp, *args, **kwargs)

    monkeypatch.setattr(cell_module, "run_experiment", fcfs_breaks)
    grid, out = write(tmp_path, "grid.toml", GRID), tmp_path / "t.parquet"
    code, stdout, stderr = run_cli(capsys, "sweep", grid, "--local", "--out", out)
    assert code == 1 and "2 ok, 2 failed" in stdout
    assert stderr.count("failed: scheduler=fcfs seed=") == 2 and "RuntimeError: the engine broke" in stderr
    table = pd.read_parquet(out).set_index("scheduler")
    assert list(table.loc["fcfs", "status"]) == ["failed"] * 2 and list(table.loc["vtc", "status"]) == ["ok"] * 2
    assert set(table.loc["fcfs", "error"]) == {"RuntimeError: the engine broke"}
    assert table.loc["fcfs", "throughput"].isna().all() and (table.loc["vtc", "throughput"] > 0).all()
    # fixed, a rerun runs the two failed cells again and replaces their rows
    monkeypatch.setattr(cell_module, "run_experiment", run_experiment)
    assert run_cli(capsys, "sweep", grid, "--local", "--out", out)[0] == 0
    table = pd.read_parquet(out)
    assert len(table) == 4 and set(table["status"]) == {"ok"}


def test_an_interrupted_sweep_keeps_the_rows_it_had(tmp_path, capsys, monkeypatch):
    def interrupted_at_the_third(exp, *args, **kwargs):
        if exp.scheduling.scheduler == "fcfs" and exp.workload.seed == 1:
            raise KeyboardInterrupt
        return run_experiment(exp, *args, **kwargs)

    monkeypatch.setattr(cell_module, "run_experiment", interrupted_at_the_third)
    out = tmp_path / "t.parquet"
    assert main(["sweep", str(write(tmp_path, "grid.toml", GRID)), "--local", "--out", str(out)]) == 130
    table = pd.read_parquet(out)
    assert sorted(zip(table["scheduler"], table["seed"])) == [("vtc", 1), ("vtc", 2)]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_worker_processes_give_the_same_rows(tmp_path, capsys):
    grid = write(tmp_path, "grid.toml", GRID)
    assert run_cli(capsys, "sweep", grid, "--local", "--out", tmp_path / "one.parquet")[0] == 0
    assert run_cli(capsys, "sweep", grid, "--local", "--jobs", "2", "--out", tmp_path / "two.parquet")[0] == 0
    assert_same_metrics(pd.read_parquet(tmp_path / "one.parquet"), pd.read_parquet(tmp_path / "two.parquet"))


def test_without_ray_the_sweep_runs_locally_and_says_so(tmp_path, capsys, monkeypatch):
    import slora_vtc.sweep.runners as runners

    monkeypatch.setattr(runners, "ray_installed", lambda: False)
    code, _, stderr = run_cli(
        capsys, "sweep", write(tmp_path, "grid.toml", GRID.replace('"fcfs"', '"lcf"')), "--out", tmp_path / "t.parquet"
    )
    assert code == 0 and "ray is not installed" in stderr and "running the grid locally" in stderr
    code, _, stderr = run_cli(capsys, "sweep", write(tmp_path, "grid.toml", GRID), "--address", "localhost:6379")
    assert (
        code == 2
        and stderr.strip()
        == "slora-vtc: error: --address needs Ray, which is not installed: pip install -r requirements-ray.txt"
    )


FIXED = '\n[fixed]\nsuite = "overload"\nduration = 20\n'


@pytest.mark.parametrize(
    "text, message",
    [
        ('[grid]\nschedulr = ["vtc"]' + FIXED, "unknown setting 'grid.schedulr' (known: suite, scheduler, "),
        ("[grid]\nscheduler = []" + FIXED, "grid.scheduler is an empty list"),
        ('[grid]\nscheduler = "vtc"' + FIXED, "grid.scheduler must be a list of values"),
        ('[grid]\nscheduler = ["vtc"]\nseed = [1, "two"]' + FIXED, "grid.seed = 'two' is not an integer"),
        ('[grid]\nscheduler = ["vtc"]\nseed = [1.5]' + FIXED, "grid.seed = 1.5 is not an integer"),
        ('[grid]\nscheduler = ["vtc"]\nprefix_cache = [1]' + FIXED, "grid.prefix_cache = 1 is not true or false"),
        ('[grid]\nscheduler = ["vtc"]\npool_tokens = [true]' + FIXED, "grid.pool_tokens = True is not an integer"),
        ('[grid]\nscheduler = ["vtc"]\nhorizon = ["x"]' + FIXED, "grid.horizon = 'x' is not a number"),
        ('[grid]\nscheduler = ["vtc"]\ncharge_cached = [false]' + FIXED, "grid.charge_cached = False is not a number"),
        ('[grid]\nscheduler = ["vtc", "nope"]' + FIXED, "cell scheduler=nope: unknown scheduler 'nope'"),
        (
            '[grid]\nscheduler = ["vtc"]\nsuite = ["overlord"]\n',
            "cell scheduler=vtc suite=overlord: unknown suite 'overlord'",
        ),
        (
            '[grid]\nscheduler = ["vtc"]\npool_tokens = [10000, 0]' + FIXED,
            "cell scheduler=vtc pool_tokens=0: --pool-tokens must be positive",
        ),
        ('[grid]\nscheduler = ["vtc"]\nseed = [1, 1]' + FIXED, "grid.seed lists 1 twice"),
        ('[grid]\nscheduler = ["vtc"]\nduration = [20]' + FIXED, "'duration' is in both [grid] and [fixed]"),
        ('[grid]\nscheduler = ["vtc"]\n', "every cell needs 'suite'"),
        (FIXED, "no [grid] table"),
        ('[grid]\nscheduler = ["vtc"]\n[runs]\nx = 1' + FIXED, "unknown table [runs]"),
        ("[grid\n", "not valid TOML"),
        ('[grid]\nscheduler = ["vtc"]\n[cluster]\nseed = 3' + FIXED, "cluster.seed is not a cluster setting"),
        (
            '[grid]\nscheduler = ["vtc"]\n[cluster]\nreplicas = 0' + FIXED,
            "cell scheduler=vtc: --replicas must be at least 1",
        ),
    ],
)
def test_a_bad_grid_is_one_line_and_runs_nothing(tmp_path, capsys, counted_runs, text, message):
    out = tmp_path / "t.parquet"
    code, stdout, stderr = run_cli(capsys, "sweep", write(tmp_path, "grid.toml", text), "--local", "--out", out)
    assert code == 2 and message in stderr and stderr.count("\n") == 1 and stderr.startswith("slora-vtc: error: ")
    assert counted_runs == [] and not out.exists()


def test_a_table_that_cannot_be_written_is_one_line_before_any_cell_runs(tmp_path, capsys, counted_runs):
    (tmp_path / "a_file").write_text("")
    grid = write(tmp_path, "grid.toml", '[grid]\nscheduler = ["vtc"]' + FIXED)
    code, _, err = run_cli(capsys, "sweep", grid, "--local", "--out", tmp_path / "a_file" / "t.parquet")
    assert_one_line_error(code, err, "cannot write a sweep table there", "a_file is not a folder one can write in")
    assert counted_runs == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--jobs", "0"], "--jobs must be at least 1"),
        (["--local", "--address", "localhost:6379"], "give one of them"),
    ],
)
def test_bad_flags_are_one_line(tmp_path, capsys, argv, message):
    code, _, stderr = run_cli(capsys, "sweep", write(tmp_path, "grid.toml", GRID), *argv)
    assert code == 2 and message in stderr and stderr.count("\n") == 1


def test_a_file_that_is_not_a_table_is_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    code, _, stderr = run_cli(capsys, "sweep", write(tmp_path, "grid.toml", GRID), "--local", "--out", junk)
    assert code == 2 and stderr.strip() == f"slora-vtc: error: {junk}: not a sweep table (not a parquet file)"
    code, _, stderr = run_cli(capsys, "sweep", tmp_path / "missing.toml", "--local")
    assert code == 2 and "cannot read grid file" in stderr


@pytest.fixture
def table(tmp_path, capsys):
    grid = write(tmp_path, "grid.toml", GRID.replace("seed = [1, 2]", "seed = [1, 2]\npool_tokens = [6000, 10000]"))
    out = tmp_path / "t.parquet"
    assert run_cli(capsys, "sweep", grid, "--local", "--out", out)[0] == 0
    return out


def is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


@pytest.mark.parametrize(
    "argv",
    [
        ["--x", "pool_tokens", "--y", "fairness_max", "--hue", "scheduler"],  # numeric x: lines, seeds in the band
        ["--x", "scheduler", "--y", "throughput", "--hue", "pool_tokens"],  # categorical x: bars
        ["--x", "seed", "--y", "ttft_mean"],  # no hue: one series
    ],
)
def test_plot_sweep_writes_a_png(table, tmp_path, capsys, argv):
    png = tmp_path / "plot.png"
    assert main(["plot-sweep", str(table), *argv, "--out", str(png)]) == 0
    assert is_png(png) and f"wrote {png}" in capsys.readouterr().out


def test_plot_sweep_writes_beside_the_table_by_default(table, capsys):
    assert main(["plot-sweep", str(table), "--x", "seed", "--y", "throughput"]) == 0
    assert is_png(table.with_name("t_throughput_by_seed.png"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--x", "sched", "--y", "throughput"], "no column 'sched' in the table (known: cell, "),
        (["--x", "scheduler", "--y", "thruput"], "no column 'thruput'"),
        (["--x", "scheduler", "--y", "throughput", "--hue", "nope"], "no column 'nope'"),
        (["--x", "seed", "--y", "scheduler"], "--y 'scheduler' is not a numeric column"),
    ],
)
def test_plot_sweep_bad_columns_are_one_line(table, capsys, argv, message):
    assert main(["plot-sweep", str(table), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    if "no column" in message:
        assert "scheduler" in err and "fairness_max" in err  # the line names the known columns


def test_plot_sweep_refuses_x_as_hue(table, capsys):
    code, out, err = run_cli(capsys, "plot-sweep", table, "--x", "scheduler", "--y", "throughput", "--hue", "scheduler")
    assert_one_line_error(code, err)
    assert (
        err == "slora-vtc: error: --hue 'scheduler' is the --x column too: give --hue another column, or leave it out\n"
    )
    assert out == "" and not list(table.parent.glob("*.png"))


# --out is checked before the table is read: these need no table
def test_plot_sweep_out_with_an_unknown_format_is_one_line(tmp_path, capsys):
    out = tmp_path / "x.txt"
    code, _, err = run_cli(
        capsys, "plot-sweep", tmp_path / "t.parquet", "--x", "seed", "--y", "ttft_mean", "--out", out
    )
    assert_one_line_error(code, err, "eps", "pdf", "png", "svg")
    assert err.startswith(f"slora-vtc: error: --out {out}: cannot write '.txt' files (supported: ")
    assert not out.exists()


@pytest.mark.parametrize(
    "given, folder",
    [("adir", "adir"), ("adir.png", "adir.png"), ("bdir", "bdir.png")],  # bdir: where bdir.png would go
)
def test_plot_sweep_out_naming_a_folder_is_one_line(tmp_path, capsys, given, folder):
    (tmp_path / folder).mkdir()
    out = tmp_path / given
    code, _, err = run_cli(
        capsys, "plot-sweep", tmp_path / "t.parquet", "--x", "seed", "--y", "ttft_mean", "--out", out
    )
    assert_one_line_error(code, err)
    which = "it" if given == folder else str(tmp_path / folder)
    expected = (
        f"slora-vtc: error: --out {out}: {which} is a folder; give a file name, such as {tmp_path / folder}/plot.png"
    )
    assert err == expected + "\n"
    assert [p.name for p in tmp_path.iterdir()] == [folder]  # nothing written


def test_plot_sweep_prints_the_file_it_writes(table, tmp_path, capsys):
    out = tmp_path / "plain"  # no extension: matplotlib's PNG, with .png added
    code, printed, err = run_cli(capsys, "plot-sweep", table, "--x", "seed", "--y", "throughput", "--out", out)
    assert code == 0, err
    assert printed == f"wrote {out}.png\n" and is_png(tmp_path / "plain.png") and not out.exists()
    svg = tmp_path / "plot.SVG"
    code, printed, err = run_cli(capsys, "plot-sweep", table, "--x", "seed", "--y", "throughput", "--out", svg)
    assert code == 0 and printed == f"wrote {svg}\n" and svg.read_text().lstrip().startswith("<?xml")


def test_cluster_fields_are_grid_keys_and_an_unknown_router_is_one_line(tmp_path, capsys):
    text = (
        '[grid]\nreplicas = [2]\nrouter = ["round-robin", "least-load"]\n'
        '[fixed]\nsuite = "overload"\nscheduler = "vtc"\nduration = 20\n'
    )
    out = tmp_path / "t.parquet"
    code, stdout, _ = run_cli(capsys, "sweep", write(tmp_path, "grid.toml", text), "--local", "--out", out)
    assert code == 0 and "2 ok" in stdout
    table = pd.read_parquet(out)
    assert list(table["router"]) == ["round-robin", "least-load"] and (table["finished"] == REQUESTS_IN_20_S).all()
    # round robin deals overload's identical requests out in turn: 45 each, the same tokens on both
    assert table["load_imbalance"].iloc[0] == 1.0 and table["load_imbalance"].iloc[1] >= 1.0
    code, _, stderr = run_cli(
        capsys, "sweep", write(tmp_path, "grid.toml", text.replace('"least-load"', '"nope"')), "--local", "--out", out
    )
    assert code == 2 and "cell replicas=2 router=nope: unknown router 'nope'" in stderr and stderr.count("\n") == 1


def test_the_example_grid_checks():
    from slora_vtc.cli.experiments import check

    cells = load_grid(REPO / "examples" / "sweep.toml")
    assert len(cells) == 3 * 2 * 2  # what its first line says
    for cell in cells:
        check(cell.experiment())


def test_a_cluster_table_sets_the_cluster_of_every_cell(tmp_path):
    text = (
        '[grid]\nscheduler = ["vtc", "fcfs"]\n[cluster]\nreplicas = 4\nrouter = "least-load"\n'
        '[fixed]\nsuite = "overload"\n'
    )
    cells = load_grid(write(tmp_path, "grid.toml", text))
    assert [c.settings for c in cells] == [
        {"suite": "overload", "replicas": 4, "router": "least-load", "scheduler": s} for s in ("vtc", "fcfs")
    ]
