"""`plot-sweep`: one metric against one setting of a sweep table, a series per value of another.

Rows sharing (x, hue) differ in the other settings: the plot shows their mean, with a band (a line
plot) or an error bar (a bar plot, for a categorical x) from their min to their max."""

import os
from pathlib import Path

from slora_vtc.errors import UserError
from slora_vtc.sweep.cell import OK


def plot_sweep(frame, x: str, y: str, hue: str | None, out: Path) -> Path:
    """Draw the table's ok rows into `out` (see output_path); return the file written. Figure
    objects only, no pyplot: safe on any backend."""
    from matplotlib.figure import Figure

    out = output_path(out)
    if hue is not None and hue == x:
        raise UserError(f"--hue '{hue}' is the --x column too: give --hue another column, or leave it out")
    check_columns(frame, [c for c in (x, y, hue) if c])
    rows = frame[frame["status"] == OK] if "status" in frame else frame
    if not _numeric(rows[y]):
        raise UserError(f"--y '{y}' is not a numeric column")
    rows = rows.dropna(subset=[y])
    if rows.empty:
        raise UserError(f"no ok row has a value of '{y}': nothing to plot")
    stats = rows.groupby([x, hue] if hue else [x], dropna=False)[y].agg(["mean", "min", "max"]).reset_index()
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    if _numeric(rows[x]) and rows[x].dtype != bool:
        _lines(ax, stats, x, hue)
    else:
        _bars(ax, stats, x, hue)
    ax.set_xlabel(x)
    ax.set_ylabel(y + (" (mean, with min to max)" if (stats["min"] != stats["max"]).any() else ""))
    if hue:
        ax.legend(title=hue)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, format=_format(out))
    return out


def output_path(out: Path) -> Path:
    """The file `--out` names: with `.png` added when it has no extension (as matplotlib does); a
    folder, or an extension matplotlib cannot write, is a UserError."""
    from matplotlib.backend_bases import FigureCanvasBase

    for path in (out, out.with_name(out.name.rstrip(".") + ".png")):
        if path.is_dir():
            which = "it" if path == out else str(path)
            raise UserError(f"--out {out}: {which} is a folder; give a file name, such as {path / 'plot.png'}")
        if _format(path):
            out = path
            break
    supported = FigureCanvasBase.get_supported_filetypes()
    if _format(out) not in supported:
        raise UserError(
            f"--out {out}: cannot write '.{_format(out)}' files (supported: {', '.join(sorted(supported))})"
        )
    return out


def _format(out: Path) -> str:
    return os.path.splitext(out.name)[1][1:].lower()


def check_columns(frame, names: list[str]) -> None:
    unknown = [n for n in names if n not in frame.columns]
    if unknown:
        raise UserError(f"no column '{unknown[0]}' in the table (known: {', '.join(map(str, frame.columns))})")


def _numeric(column) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(column)


def _series(stats, hue: str | None):
    if hue is None:
        yield None, stats
    else:
        yield from stats.groupby(hue, dropna=False, sort=True)


def _lines(ax, stats, x: str, hue: str | None) -> None:
    for value, part in _series(stats, hue):
        part = part.sort_values(x)
        (line,) = ax.plot(part[x], part["mean"], marker="o", label=None if hue is None else str(value))
        ax.fill_between(part[x], part["min"], part["max"], color=line.get_color(), alpha=0.2, linewidth=0)


def _bars(ax, stats, x: str, hue: str | None) -> None:
    import numpy as np

    categories = list(dict.fromkeys(stats[x].astype(str)))
    series = list(_series(stats, hue))
    width = 0.8 / len(series)
    for i, (value, part) in enumerate(series):
        where = np.array([categories.index(c) for c in part[x].astype(str)]) + (i - (len(series) - 1) / 2) * width
        mean = part["mean"].to_numpy()
        spread = [mean - part["min"].to_numpy(), part["max"].to_numpy() - mean]
        ax.bar(where, mean, width, yerr=spread, capsize=3, label=None if hue is None else str(value))
    ax.set_xticks(range(len(categories)), categories)
