"""`slora-vtc sweep` on a local Ray (skipped when Ray is not installed: requirements-ray.txt):
8 cells finish, a rerun skips them all, a cell that raises in its Ray task is recorded as failed,
--local gives the same rows, and an address where no Ray answers is one line."""

import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # every test starts `python -m slora_vtc sweep` as a process
pytest.importorskip("ray")

from tests.helpers.cli import cli  # noqa: E402
from tests.helpers.sweep import assert_same_metrics  # noqa: E402

# 4 schedulers x 2 seeds of the paper's overload workload, 20 s of arrivals each
GRID = """
[grid]
scheduler = ["vtc", "fcfs", "lcf", "rpm:30"]
seed = [1, 2]

[fixed]
suite = "overload"
duration = 20
"""
# a scheduler that builds (so the grid passes its checks) and raises once requests arrive
BREAKS_AT_RUN_TIME = """
from slora_vtc.sched import Entry, register_scheduler
from slora_vtc.sched.fcfs import FCFS

class Breaks(FCFS):
    def on_arrival(self, req, now):
        raise RuntimeError(f"broke on the arrival of {req.client}")

register_scheduler("breaks", Entry(lambda arg, clients, opts: Breaks(), "raises on the first arrival"))
"""


@pytest.fixture(scope="module")
def ray_sweep(tmp_path_factory):
    """The grid run once on a local Ray of 2 CPUs, then run again."""
    folder = tmp_path_factory.mktemp("ray_sweep")
    grid, out = folder / "grid.toml", folder / "t.parquet"
    grid.write_text(GRID)
    first = cli("sweep", grid, "--out", out, "--jobs", "2")
    table = pd.read_parquet(out) if out.exists() else None
    again = cli("sweep", grid, "--out", out, "--jobs", "2")
    return grid, first, table, again, pd.read_parquet(out) if out.exists() else None


def test_eight_cells_finish_on_a_local_ray(ray_sweep):
    _, first, table, _, _ = ray_sweep
    assert first.returncode == 0, first.stderr
    assert "8 ok, 0 failed, 0 skipped" in first.stdout and "not installed" not in first.stderr
    assert len(table) == 8 and set(table["status"]) == {"ok"}
    assert sorted(zip(table["scheduler"], table["seed"])) == sorted(
        (s, n) for s in ["vtc", "fcfs", "lcf", "rpm:30"] for n in (1, 2)
    )
    assert (table["requests"] == 30 + 60).all() and (table["finished"] > 0).all()
    # rpm:30 refuses what a client sends beyond 30 a minute: client0 sends 30 in the 20 s, client1 60
    rpm = table[table["scheduler"] == "rpm:30"]
    assert (rpm["rejected"] == 60 - 30).all() and (table[table["scheduler"] != "rpm:30"]["rejected"] == 0).all()


def test_a_rerun_skips_all_eight(ray_sweep):
    _, _, table, again, after = ray_sweep
    assert again.returncode == 0, again.stderr
    assert "8 already in" in again.stderr and "0 to run" in again.stderr and "0 ok, 0 failed, 8 skipped" in again.stdout
    pd.testing.assert_frame_equal(after, table)  # not one row rewritten: same wall times, same finish stamps


def test_local_gives_the_same_rows_as_ray(ray_sweep, tmp_path):
    grid, _, table, _, _ = ray_sweep
    local = cli("sweep", grid, "--local", "--out", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    assert_same_metrics(table, pd.read_parquet(tmp_path / "local.parquet"))


def test_a_cell_that_raises_in_its_ray_task_is_recorded_and_the_others_finish(tmp_path):
    plugin, grid, out = tmp_path / "breaks.py", tmp_path / "grid.toml", tmp_path / "t.parquet"
    plugin.write_text(BREAKS_AT_RUN_TIME)
    grid.write_text(GRID.replace('"rpm:30"', '"breaks"'))
    proc = cli("--plugin", plugin, "sweep", grid, "--out", out, "--jobs", "2")
    assert proc.returncode == 1, proc.stderr
    assert "6 ok, 2 failed" in proc.stdout and proc.stderr.count("failed: scheduler=breaks seed=") == 2
    table = pd.read_parquet(out)
    assert len(table) == 8
    failed = table[table["status"] == "failed"]
    assert sorted(failed["scheduler"]) == ["breaks", "breaks"]
    assert all(
        e in ("RuntimeError: broke on the arrival of client0", "RuntimeError: broke on the arrival of client1")
        for e in failed["error"]
    )
    assert (table[table["status"] == "ok"]["finished"] > 0).all()


def test_an_address_where_no_ray_answers_is_one_line(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    proc = cli("sweep", grid, "--address", "127.0.0.1:1", "--out", tmp_path / "t.parquet")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "slora-vtc: error: Ray at '127.0.0.1:1' does not answer (Connection refused)"
    ]
    assert not (tmp_path / "t.parquet").exists()
    from_env = cli(
        "sweep", grid, "--out", tmp_path / "t.parquet", RAY_ADDRESS="127.0.0.1:1"
    )  # Ray's convention: $RAY_ADDRESS
    assert from_env.returncode == 2 and "Ray at '127.0.0.1:1' does not answer" in from_env.stderr
    bad = cli("sweep", grid, "--address", "nowhere")
    assert bad.returncode == 2 and "expected HOST:PORT" in bad.stderr and bad.stderr.count("\n") == 1
