"""The figures command end to end on its cheapest figures (the rest is `make figures`)."""

import json

import pytest

from slora_vtc.errors import UserError
from slora_vtc.figures import FIGURES, render_figures


@pytest.mark.slow
def test_renders_pngs_and_merges_numbers(tmp_path):
    paths = render_figures(["cost_profile", "weighted"], tmp_path, jobs=1)
    assert {p.name for p in paths} == {"cost_profile.png", "weighted.png", "numbers.json"}
    assert all(p.stat().st_size > 10_000 for p in paths if p.suffix == ".png")
    render_figures(["cost_profile"], tmp_path, jobs=1)
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    assert set(numbers) == {"cost_profile", "weighted"}  # a later run keeps earlier figures' numbers
    ratios = numbers["weighted"]["wvtc"]["ratio_to_client0"]
    assert [round(r) for r in ratios.values()] == [1, 2, 3, 4]


def test_every_paper_figure_is_registered():
    named = {f.paper_figure for f in FIGURES.values()}
    assert {
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
        "9",
        "10",
        "11",
        "12",
        "13",
        "14",
        "15",
        "16",
        "17",
        "18",
        "19",
        "20",
    } <= named


def test_unknown_figure_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="unknown figure 'nope'"):
        render_figures(["nope"], tmp_path)
