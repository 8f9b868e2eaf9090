"""`sweep` and `plot-sweep`: a grid of runs as Ray tasks (or local processes) into one parquet table.

Exit status of `sweep`: 0 when every cell is ok (run now or before), 1 when a cell failed (each
failure is in the table and listed at the end), 2 for bad input, before any cell runs.
"""

import os
import sys
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

from slora_vtc.cli.experiments import check
from slora_vtc.errors import UserError
from slora_vtc.plugins import PLUGINS_ENV
from slora_vtc.results import check_writable


def cmd_sweep(args) -> int:
    from slora_vtc.sweep.table import SweepTable  # here, as every command's imports: the CLI starts faster

    use_ray = _use_ray(args)
    cells = _checked_cells(Path(args.grid))
    out = Path(args.out) if args.out else Path("results") / f"{Path(args.grid).stem}.parquet"
    check_writable(out, "a sweep table")  # before the cells run, not after
    table = SweepTable(out)
    todo = [c for c in cells if c.id not in table.finished()]
    failed = _run(
        todo, args, use_ray, table, f"{len(cells)} cells: {len(cells) - len(todo)} already in {out}, {len(todo)} to run"
    )
    labels = {c.id: c.label for c in cells}
    for row in failed:
        print(f"failed: {labels[row['cell']]}: {row['error']}", file=sys.stderr)
    print(f"wrote {out} ({len(todo) - len(failed)} ok, {len(failed)} failed, {len(cells) - len(todo)} skipped)")
    return 1 if failed else 0


def _use_ray(args) -> bool:
    """Whether the cells run on Ray; the flags checked against each other and against Ray being installed."""
    from slora_vtc.sweep.runners import ray_installed

    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {args.jobs}")
    if args.local and args.address:
        raise UserError("--address runs on a Ray cluster; --local runs here: give one of them")
    use_ray = not args.local and ray_installed()
    if not use_ray and args.address:
        raise UserError("--address needs Ray, which is not installed: pip install -r requirements-ray.txt")
    return use_ray


def _checked_cells(grid: Path) -> list:
    """The grid's cells, every one checked as `run` checks its flags, before any runs."""
    from slora_vtc.sweep.grid import load_grid

    cells = load_grid(grid)
    for cell in cells:
        try:
            check(cell.experiment())
        except UserError as e:
            raise UserError(f"cell {cell.label}: {e}") from None
    return cells


def _run(todo: list, args, use_ray: bool, table, plan: str) -> list[dict]:
    """Run the cells (on Ray once it answers, or here) into the table; the failed rows."""
    from slora_vtc.sweep.runners import ray_session, run_local, run_on_ray

    if todo and not args.local and not use_ray:
        print("ray is not installed (pip install -r requirements-ray.txt): running the grid locally", file=sys.stderr)
    address = args.address or os.environ.get("RAY_ADDRESS") or None  # Ray's own convention
    with ray_session(address, args.jobs) if use_ray and todo else nullcontext():
        print(plan, file=sys.stderr)
        plugins = _plugins(args.plugin)
        rows = run_on_ray(todo, args.jobs, plugins) if use_ray else run_local(todo, args.jobs or 1, plugins)
        return _collect(rows, len(todo), table)


def _collect(rows, total: int, table) -> list[dict]:
    """Add each row to the table as it comes, under one progress bar; the failed rows."""
    from tqdm import tqdm

    from slora_vtc.sweep.cell import OK

    revision, failed = git_revision(), []
    with tqdm(total=total, desc="sweep", unit="run", disable=not total) as bar:
        for row in rows:
            table.add(
                {**row, "git_rev": revision, "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            )
            if row["status"] != OK:
                failed.append(row)
            bar.set_postfix(failed=len(failed), refresh=False)
            bar.update()
    return failed


def _plugins(given: list[str]) -> tuple[str, ...]:
    """The driver's plugins, as the workers load them (files by absolute path: a worker's folder may differ)."""
    env = [p for p in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if p]
    return tuple(str(Path(p).resolve()) if p.endswith(".py") or os.sep in p else p for p in [*env, *given])


def git_revision() -> str:
    """HEAD of the repository this package runs from, or 'unknown' outside one."""
    import subprocess

    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def cmd_plot_sweep(args) -> int:
    from slora_vtc.sweep.plot import output_path, plot_sweep
    from slora_vtc.sweep.table import read_table

    table = Path(args.table)
    out = output_path(Path(args.out) if args.out else table.with_name(f"{table.stem}_{args.y}_by_{args.x}.png"))
    frame = read_table(table)
    out = plot_sweep(frame, args.x, args.y, args.hue, out)
    print(f"wrote {out}")
    return 0


def add_parsers(sub) -> None:
    sweep = sub.add_parser(
        "sweep",
        help="run a grid of experiments (a TOML file) as Ray tasks into one parquet table",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    sweep.add_argument(
        "grid",
        help="grid file: [grid] maps settings (suite, scheduler, seed, duration, ...) to lists; "
        "[fixed] sets shared ones",
    )
    sweep.add_argument("--out", help="the table (default: results/GRID.parquet); a rerun skips the cells it has as ok")
    sweep.add_argument(
        "--address", help="a Ray cluster: HOST:PORT, ray://HOST:PORT or auto (default: $RAY_ADDRESS, else a local Ray)"
    )
    sweep.add_argument(
        "--local", action="store_true", help="run here without Ray (also what happens when Ray is not installed)"
    )
    sweep.add_argument("--jobs", type=int, help="runs at once (default: every core for a local Ray, 1 with --local)")
    sweep.set_defaults(func=cmd_sweep)

    plot = sub.add_parser("plot-sweep", help="plot a sweep table: --y against --x, one series per --hue value")
    plot.add_argument("table", help="a table written by `slora-vtc sweep`")
    plot.add_argument("--x", required=True, help="a column for the x axis (a numeric one gives lines, another bars)")
    plot.add_argument("--y", required=True, help="a numeric column (a metric) for the y axis")
    plot.add_argument("--hue", help="a column whose values each get a series")
    plot.add_argument(
        "--out",
        help="image file: PNG, or another format by its extension (.svg, .pdf, ...); .png is added to a name "
        "without one (default: beside the table, TABLE_Y_by_X.png)",
    )
    plot.set_defaults(func=cmd_plot_sweep)
