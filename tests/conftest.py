"""Environment, fixtures and hooks only: what tests share lives in tests/helpers (tests/README.md)."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from slora_vtc.data import measured_run  # noqa: E402


@pytest.fixture
def paper_results():
    """The artifact's measured result files, by name (they ship in data/measured/)."""
    return measured_run
