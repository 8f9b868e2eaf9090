"""Sweeps: a grid of experiments (a TOML file), run as Ray tasks or locally, one parquet row per run.

grid.py reads and checks the grid, cell.py runs one cell into a row, table.py keeps the table,
runners.py runs the cells (Ray or local processes), plot.py draws a table.
"""

from slora_vtc.sweep.cell import Cell, run_cell
from slora_vtc.sweep.grid import load_grid

__all__ = ["Cell", "load_grid", "run_cell"]
