"""Where the shared measured data lives (never copied into the repo).

`$SLORA_VTC_DATA`, else `../shared/data` beside the checkout. Everything that reads from it
works without it, or says plainly what is missing.
"""

import os
from pathlib import Path

A10G_PROFILE = "cost_profile_a10g_llama7b.json"
REAL_TRACE = "lmsys_real_trace.json"
PAPER_RESULTS = "paper_results"


def data_dir() -> Path:
    env = os.environ.get("SLORA_VTC_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def data_file(name: str) -> Path | None:
    path = data_dir() / name
    return path if path.exists() else None
