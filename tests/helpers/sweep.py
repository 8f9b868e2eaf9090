"""The sweep tests' helpers (with Ray and without)."""

import pandas as pd


def assert_same_metrics(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """The same cells with the same results: everything but when and how long they ran."""
    machine = ["wall_s", "finished_at"]
    a, b = (t.drop(columns=machine).sort_values("cell").reset_index(drop=True) for t in (a, b))
    pd.testing.assert_frame_equal(a, b)
