"""The measured data that ships with the repository (see data/README.md).

Paths are relative to the repository root, or to `$SLORA_VTC_DATA` when it is set (a folder with
the same layout, for a package installed without the repository). Nothing else is ever read.
"""

import os
from pathlib import Path

from slora_vtc.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
A10G_PROFILE = "profiles/a10g_llama7b.json"
REAL_TRACE = "traces/lmsys_real_trace.json"
MEASURED = "data/measured"
PAPER_REPORTED = "data/paper/reported.json"


def data_root() -> Path:
    env = os.environ.get("SLORA_VTC_DATA")
    return Path(env) if env else REPO_ROOT


def data_file(name: str) -> Path:
    """A shipped data file; a UserError names it when it is missing."""
    path = data_root() / name
    if not path.exists():
        hint = (
            " ($SLORA_VTC_DATA is set: it must hold the repository's data layout)"
            if os.environ.get("SLORA_VTC_DATA")
            else ""
        )
        raise UserError(f"{path} is missing: it ships with the repository{hint}")
    return path


def measured_run(name: str) -> Path:
    """One of the artifact's measured result files, e.g. `vtc_overload.jsonl`."""
    return data_file(f"{MEASURED}/{name}")
