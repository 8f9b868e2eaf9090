"""Where the cells run: as Ray tasks (a local Ray, or a cluster at an address) or in this machine's
processes. Each runner yields one row per cell, as the cells finish."""

import logging
import os
import socket
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager

from slora_vtc.errors import UserError
from slora_vtc.sweep.cell import Cell, error_line, failed_row, run_cell

PROBE_TIMEOUT_S = 5.0


def ray_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def run_local(cells: list[Cell], jobs: int, plugins: tuple[str, ...]) -> Iterator[dict]:
    """In this process (jobs 1), or in `jobs` worker processes."""
    if jobs <= 1:
        for cell in cells:
            yield run_cell(cell, plugins)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_cell, cell, plugins): cell for cell in cells}
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as e:  # noqa: BLE001 - a worker that died: its cell failed, the others go on
                yield failed_row(futures[future], error_line(e))


def run_on_ray(cells: list[Cell], jobs: int | None, plugins: tuple[str, ...]) -> Iterator[dict]:
    """As Ray tasks of one CPU each (Ray is up: `ray_session`), at most `jobs` in flight (default: all)."""
    import ray

    task = ray.remote(num_cpus=1)(run_cell)
    queue, pending = iter(cells), {}

    def submit() -> None:
        cell = next(queue, None)
        if cell is not None:
            pending[task.remote(cell, plugins)] = cell

    for _ in range(jobs or len(cells)):
        submit()
    while pending:
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        cell = pending.pop(ref)
        submit()
        try:
            yield ray.get(ref)
        except ray.exceptions.RayError as e:  # the task's worker died: its cell failed
            yield failed_row(cell, error_line(e))


@contextmanager
def ray_session(address: str | None, jobs: int | None):
    """A local Ray (no dashboard, quiet) or the cluster at `address`, shut down afterwards."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    if address is not None:
        probe(address)
    try:
        with stderr_muted():  # Ray's C++ core logs each retry of a connection that fails
            if address is None:
                ray.init(
                    address="local", num_cpus=jobs or os.cpu_count(), include_dashboard=False, **quiet
                )  # local: never a cluster found on disk
            else:
                ray.init(address=address, **quiet)
    except Exception as e:  # noqa: BLE001 - whatever Ray raises, the user needs one line
        where = "a local Ray does not start" if address is None else f"Ray at '{address}' does not answer"
        raise UserError(f"{where} ({error_line(e)})") from None
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def stderr_muted():
    """File descriptor 2 to /dev/null for a while (what Ray's C++ code writes bypasses sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def probe(address: str) -> None:
    """Refuse at once, in one line, an address where nothing listens (Ray itself retries for 20 s)."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise UserError(f"--address '{address}': expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise UserError(f"Ray at '{address}' does not answer ({e.strerror or e})") from None
