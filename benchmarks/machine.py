"""The machine a benchmark ran on, recorded beside its numbers (these machines differ by up to 3x)."""

import datetime
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cpuinfo(key: str) -> str | None:
    """The value of the first line of /proc/cpuinfo named `key` (None where there is none, or no such file)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


VECTORS = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))


def cpu_vectors() -> str:
    """The widest vector instructions the CPU offers (x86): vLLM's CPU kernels and torch's matrix
    multiplications pick their code by it, so a ratio between them moves with it."""
    flags = cpuinfo("flags")
    if flags is None:
        return "unknown"
    return next((name for flag, name in VECTORS if flag in flags.split()), "none known")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (Linux /proc); 0 for a process gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return rev.stdout.strip() or "unknown"


def machine_info(**versions: str) -> dict:
    """Date, CPU, cores, platform, Python, the git revision, and any `versions` given (name=version)."""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_vectors": cpu_vectors(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions,
        "git": git_revision(),
    }
