"""The package stands alone: run from a copy of the repository in an otherwise empty folder, with
an empty $HOME, the simulator's commands work, read no file outside the copy, and import no torch."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.files import REPO

pytestmark = pytest.mark.slow  # the commands run in a fresh Python process, from a copy of the repository

# the commands that read the shipped data (trace, profile, measured runs), each on the simulator
COMMANDS = [
    ["list"],
    ["run", "--suite", "real", "--scheduler", "vtc", "--duration", "60", "--out", "{out}/real.jsonl"],
    [
        "replay",
        "traces/lmsys_real_trace.json",
        "--scheduler",
        "fcfs",
        "--duration",
        "30",
        "--out",
        "{out}/replay.jsonl",
    ],
    ["compare", "--suite", "overload", "--schedulers", "vtc", "wvtc:1,2", "--duration", "30"],
    ["figures", "--only", "overload,cost_profile", "--out", "{out}/figures", "--jobs", "1"],
    ["calibrate"],
]
HEAVY = ("torch", "triton", "transformers", "fastapi", "uvicorn")

RUNNER = textwrap.dedent("""
    import json, os, sys
    opened, heavy = [], {heavy!r}
    for name in heavy:
        sys.modules[name] = None  # any import of it raises ImportError
    def record_open(event, args):
        if event == "open" and isinstance(args[0], (str, bytes)):
            opened.append(os.path.abspath(args[0]))
    sys.addaudithook(record_open)
    from slora_vtc.cli import main
    codes = [main([a.format(out={out!r}) for a in argv]) for argv in {commands!r}]
    json.dump({{"codes": codes, "opened": opened, "package": sys.modules["slora_vtc"].__file__,
               "heavy": sorted(m for m in heavy if sys.modules.get(m) is not None)}}, open({report!r}, "w"))
""")


def tracked_files() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    base = tmp_path_factory.mktemp("alone")
    copy, home, out = base / "nest" / "repo", base / "home", base / "out"
    for name in tracked_files():
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    home.mkdir()
    out.mkdir()
    report = base / "report.json"
    script = RUNNER.format(heavy=HEAVY, out=str(out), commands=COMMANDS, report=str(report))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLORA_VTC")}
    env.update(HOME=str(home), PYTHONPATH=str(copy), MPLBACKEND="Agg", MPLCONFIGDIR=str(base / "mpl"))
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=copy, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(report.read_text()), "copy": copy, "home": home, "out": out}


def test_every_command_works_from_a_lone_copy(isolated):
    assert isolated["codes"] == [0] * len(COMMANDS)
    assert Path(isolated["package"]).is_relative_to(isolated["copy"])
    assert (isolated["out"] / "figures" / "overload.png").exists() and (
        isolated["out"] / "figures" / "cost_profile.png"
    ).exists()


def test_nothing_outside_the_repository_is_read(isolated):
    copy, outside = isolated["copy"], []
    fine = (copy, isolated["out"], Path(sys.prefix), Path(sys.base_prefix))  # the copy, its outputs, Python itself
    watched = (REPO, REPO.parent, copy.parent, isolated["home"])  # the checkout, what lies beside it (../shared), $HOME
    for name in isolated["opened"]:
        path = Path(name)
        if not any(path.is_relative_to(f) for f in fine) and any(path.is_relative_to(w) for w in watched):
            outside.append(str(path))
    assert outside == []
    assert any(Path(p).name == "lmsys_real_trace.json" for p in isolated["opened"])  # the check does see reads


def test_the_simulator_path_imports_no_torch(isolated):
    assert isolated["heavy"] == []  # and every command above succeeded with those imports blocked
