"""Wall time of `slora-vtc figures` (every paper figure, simulated and drawn) into a temp folder."""

import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 180.0
TIMEOUT_S = 1800.0


def unavailable_reason() -> str | None:
    """Why `slora_vtc.figures` cannot render figures yet, or None when it can."""
    try:
        module = importlib.import_module("slora_vtc.figures")
    except Exception as err:  # a module being written may fail in any way
        return f"import failed: {type(err).__name__}: {err}"
    if not hasattr(module, "render_figures"):
        return "slora_vtc.figures has no render_figures"
    return None


def figures_command(out: str) -> list[str]:
    return [sys.executable, "-m", "slora_vtc", "figures", "--out", out]


def measure_figures() -> dict:
    """Run the figures command once (its own progress goes to stderr) and time it."""
    reason = unavailable_reason()
    if reason:
        return {"status": "not available", "reason": reason, "target_s": TARGET_S}
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                figures_command(out),
                cwd=REPO,
                env={**os.environ, "MPLBACKEND": "Agg"},
                stdout=subprocess.PIPE,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "wall_s": time.perf_counter() - start, "target_s": TARGET_S}
        wall_s = time.perf_counter() - start
        files = sorted(p.name for p in Path(out).rglob("*") if p.is_file())
    row = {
        "status": "ok" if proc.returncode == 0 else "failed",
        "wall_s": wall_s,
        "returncode": proc.returncode,
        "files": len(files),
        "target_s": TARGET_S,
        "cpus": os.cpu_count(),
    }
    if proc.returncode != 0:
        row["stdout_tail"] = proc.stdout[-2000:]
    return row
