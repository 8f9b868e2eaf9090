"""scripts/gpu_check.sh: its dry run (every step at tiny sizes on the CPU) and its failures.

The dry run here hides the packages the GPU machine lacks (tqdm, fastapi, uvicorn, ...), so it
shows that the check needs none of them; its results folder must hold at most 8 files, each at
most two folders deep, as only those come back from the GPU machine.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slora_vtc.profile import load_profile

pytestmark = pytest.mark.slow  # scripts/gpu_check.sh and the Python processes it starts

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = [
    "environment",
    "install",
    "kernel_bench",
    "model_bench",
    "kernel_tests",
    "profile",
    "run_vtc",
    "run_fcfs",
    "sim_from_profile",
]
NOT_ON_THE_GPU_MACHINE = ("tqdm", "fastapi", "uvicorn", "prometheus_client", "openai", "httpx2", "pyarrow")

# sitecustomize for the check's pythons: an installed copy of these packages does not import
# (a stand-in the check writes itself, outside site-packages, still does)
HIDE = f"""
import importlib.machinery, sys

HIDDEN = {set(NOT_ON_THE_GPU_MACHINE)!r}


class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in HIDDEN:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or "site-packages" in (spec.origin or ""):
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden: the GPU machine lacks it)", name=name)
        return spec


sys.meta_path.insert(0, _Hide())
"""


def check_env(tmp_path: Path, **extra: str) -> dict:
    """The environment of a check that runs like on the GPU machine: none of NOT_ON_THE_GPU_MACHINE."""
    bare = tmp_path / "bare"
    bare.mkdir(exist_ok=True)
    (bare / "sitecustomize.py").write_text(HIDE)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_") and k not in ("OUT", "TRITON_INTERPRET")
    }
    pythonpath = os.pathsep.join(p for p in (str(bare), os.environ.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": pythonpath, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **extra}


def run_check(*args: str, env: dict, timeout: int = 240) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - start


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    out = tmp / "out"  # the folder that would come back from the GPU machine
    done, seconds = run_check("--dry-run", env=check_env(tmp, OUT=str(out)))
    return done, out, seconds


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_the_dry_run_passes_every_step(dry_run):
    done, out, _ = dry_run  # about 30 s on 2 idle cores
    assert done.returncode == 0, done.stdout + done.stderr
    summary = summary_of(out)
    assert summary["dry_run"] and summary["final"] and summary["all_passed"]
    assert [s["name"] for s in summary["steps"]] == STEPS
    assert all(s["status"] == "passed" for s in summary["steps"]), summary["steps"]
    text = (out / "summary.txt").read_text()
    assert "DRY RUN" in text and "all steps passed" in text
    assert all(f"{name:18s} passed" in text for name in STEPS)


def test_the_dry_run_leaves_at_most_8_files_at_most_two_folders_deep(dry_run):
    _, out, _ = dry_run
    files = [p.relative_to(out) for p in out.rglob("*") if not p.is_dir()]
    assert 0 < len(files) <= 8, files
    assert all(len(f.parts) <= 3 for f in files), files  # at most two folders, then the file
    assert {"summary.json", "summary.txt", "logs.txt", "profile.json", "run_vtc.jsonl", "run_fcfs.jsonl"} <= {
        str(f) for f in files
    }
    assert sorted(summary_of(out)["files"]) == sorted(str(f) for f in files)


def test_the_dry_run_writes_a_profile_the_simulator_reads(dry_run):
    _, out, _ = dry_run
    points = load_profile(out / "profile.json")
    assert {(p.input_len, p.output_len) for p in points} == {(8, 1), (8, 3), (16, 1), (16, 3)}
    assert summary_of(out)["results"]["profile"]["loads"]


@pytest.mark.parametrize("scheduler", ["vtc", "fcfs"])
def test_the_dry_run_writes_a_real_run_under_each_scheduler(dry_run, scheduler):
    _, out, _ = dry_run
    lines = (out / f"run_{scheduler}.jsonl").read_text().splitlines()
    assert len(lines) == 1
    run = json.loads(lines[0])
    assert run["config"]["scheduler"] == scheduler and run["config"]["backend"] == "torch"
    assert run["result"]["responses"]
    summary = summary_of(out)["results"][f"run_{scheduler}"]
    assert summary["finished"] > 0 and summary["requests"] == len(run["result"]["responses"])


def test_the_dry_run_measures_what_the_gpu_run_reports(dry_run):
    _, out, _ = dry_run
    results = summary_of(out)["results"]
    bench = json.loads((out / "kernel_bench.json").read_text())
    assert bench["dry_run"] and {c["case"] for c in bench["decode"]} == set(results["decode_attention"]["by_case"])
    assert all(c["max_abs_err"] < 1e-2 for c in bench["decode"] + bench["prefill"])
    assert results["decode_attention"]["target"] == ">= 0.60" and results["decode_attention"]["peak_gbps"] == 4800
    model = results["model_bench"]
    assert model["model"] == "tiny" and all(v > 0 for v in model["decode_tokens_per_s"].values())
    assert all(v > 0 for v in model["prefill_tokens_per_s"].values())
    tests = results["kernel_tests"]
    assert tests["passed"] > 0 and tests["failed"] == 0


def test_the_dry_run_needs_none_of_the_packages_the_gpu_machine_lacks(dry_run):
    _, out, _ = dry_run
    summary = summary_of(out)
    assert summary["environment"]["packages"]["tqdm"] is not None  # installed here, hidden from the check ...
    assert any("tqdm" in shim for shim in summary["install"]["shims"])  # ... which brought its stand-in
    assert summary["install"]["verified"] and summary["install"]["method"].startswith("PYTHONPATH=")


@pytest.mark.skipif(
    torch.cuda.is_available() or shutil.which("nvidia-smi") is not None,
    reason="checks the failure on a machine without a GPU",
)
def test_without_a_gpu_the_check_fails_loudly_and_quickly(tmp_path):
    out = tmp_path / "out"
    done, seconds = run_check(str(out), env=check_env(tmp_path), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no GPU" in done.stderr and "nvidia-smi is not on PATH" in done.stderr
    assert seconds < 30
    summary = summary_of(out)
    assert not summary["all_passed"] and summary["steps"][0]["status"] == "FAILED (exit 3)"
    assert all(s["status"] == "not run (no GPU)" for s in summary["steps"][1:])
    assert "torch.cuda.is_available() is False" in (out / "summary.txt").read_text()


def test_a_failing_step_is_recorded_and_the_later_steps_still_run(tmp_path):
    out = tmp_path / "out"
    env = check_env(tmp_path, GPU_CHECK_MODEL="no-such-model", GPU_CHECK_SKIP="kernel_tests kernel_bench")
    done, _ = run_check("--dry-run", str(out), env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    status = {s["name"]: s["status"] for s in summary_of(out)["steps"]}
    assert status["environment"] == status["install"] == "passed"
    assert status["kernel_tests"] == status["kernel_bench"] == "skipped"
    for name in ("model_bench", "profile", "run_vtc", "run_fcfs", "sim_from_profile"):  # each ran, and failed
        assert status[name].startswith("FAILED (exit"), status
    assert "unknown model 'no-such-model'" in (out / "logs.txt").read_text()
    assert "SOME STEPS FAILED" in (out / "summary.txt").read_text()
