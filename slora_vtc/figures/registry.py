"""Every figure by name. A new figure: a module with a `Figure` (the experiments it needs and how
to draw them), plus its entry here, or `register_figure` from outside the package (docs/extending.md)."""

from slora_vtc.errors import UserError
from slora_vtc.figures import (
    batching,
    beyond,
    calibration,
    cluster,
    cost_profile,
    real,
    spread,
    synthetic,
    tables,
    testbeds,
    variants,
)
from slora_vtc.figures.base import Figure

FIGURES: dict[str, Figure] = {
    f.name: f
    for f in [
        *synthetic.FIGURES,
        *variants.FIGURES,
        *cost_profile.FIGURES,
        *calibration.FIGURES,
        *real.FIGURES,
        *spread.FIGURES,
        *testbeds.FIGURES,
        *tables.FIGURES,
        *beyond.FIGURES,
        *cluster.FIGURES,
        *batching.FIGURES,
    ]
}


def register_figure(figure: Figure) -> Figure:
    """Add a figure (from a plugin); a name that is taken is an error."""
    if figure.name in FIGURES:
        raise UserError(f"figure '{figure.name}' is already registered")
    FIGURES[figure.name] = figure
    return figure
