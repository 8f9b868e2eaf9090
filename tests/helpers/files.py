"""Where the repository's files are, and small files written for a test."""

import json
import textwrap
from pathlib import Path

from slora_vtc.data import A10G_PROFILE, REAL_TRACE, data_file

REPO = Path(__file__).resolve().parents[2]
ARENA_FIXTURE = REPO / "traces" / "arena_fixture.jsonl"
PLUGIN = REPO / "examples" / "plugins" / "round_robin.py"  # docs/extending.md's worked example


def a10g_profile() -> Path:
    return data_file(A10G_PROFILE)


def lmsys_trace() -> Path:
    return data_file(REAL_TRACE)


def write(folder: Path, name: str, text: str) -> Path:
    """`text`, dedented (textwrap.dedent), as folder/name."""
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def write_jsonl(path: Path, records: list) -> Path:
    """One line per record: a string as it is, anything else as JSON."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path
