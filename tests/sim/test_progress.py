"""The progress bar a short run does not pay for (slora_vtc/progress.py)."""

import pytest

from slora_vtc.progress import LazyProgress, tracked


def test_a_bar_is_drawn_only_once_the_run_has_lasted_its_delay(capsys):
    with LazyProgress(3, "quick", delay_s=60) as bar:
        for _ in range(3):
            bar.update()
    assert bar.count == 3 and capsys.readouterr().err == ""  # never drawn: tqdm not even imported for it
    with LazyProgress(3, "slow", delay_s=0) as bar:
        for _ in range(3):
            bar.update()
    assert bar.count == 3 and "slow" in capsys.readouterr().err


def test_tracked_yields_every_item_in_order_and_counts_it(capsys):
    items = ["a", "b", "c", "d"]
    assert list(tracked(items, "items", "item", enabled=False)) == items
    seen = []
    for item in tracked(items, "drawn", "item", enabled=True):
        seen.append(item)
    assert seen == items and capsys.readouterr().err == ""  # under a second: no bar


@pytest.mark.parametrize("enabled", [True, False])
def test_tracked_of_nothing_is_nothing(enabled):
    assert list(tracked([], "none", "item", enabled)) == []
