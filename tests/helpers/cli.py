"""The command line from the tests: in this process (fast, capsys catches its output) or as
`python -m slora_vtc` in a fresh process (what a user runs; these tests are marked slow)."""

import os
import subprocess
import sys

from slora_vtc.cli import main
from tests.helpers.files import REPO


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """`slora-vtc ARGV` in this process: its exit status, stdout and stderr."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def cli(*argv, cwd=REPO, timeout: float = 300, **env_vars: str) -> subprocess.CompletedProcess:
    """`python -m slora_vtc ARGV` in a fresh process, in `cwd` (the repository unless told), text
    captured; its environment is ours with MPLBACKEND=Agg, without RAY_ADDRESS (a sweep starts a
    local Ray unless told) and with `env_vars` added."""
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "MPLBACKEND": "Agg", **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "slora_vtc", *map(str, argv)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(code: int, err: str, *parts: str) -> None:
    """Bad input: exit status 2 and one line on stderr, `slora-vtc: error: ...` naming every part; no traceback."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("slora-vtc: error:") and all(part in lines[0] for part in parts), lines[0]
