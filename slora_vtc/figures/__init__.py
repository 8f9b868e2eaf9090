"""Every figure, by name; `render_figures` runs the experiments they need (in parallel) and draws them."""

import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tqdm import tqdm

from slora_vtc.data import data_file
from slora_vtc.errors import UserError
from slora_vtc.experiment import Experiment
from slora_vtc.figures.base import Figure, Results
from slora_vtc.figures.registry import FIGURES, register_figure
from slora_vtc.runner import run_experiment

__all__ = ["FIGURES", "register_figure", "render_figures"]
NUMBERS_FILE = "numbers.json"


def select(names: list[str] | None) -> list[Figure]:
    unknown = [n for n in names or [] if n not in FIGURES]
    if unknown:
        raise UserError(f"unknown figure '{unknown[0]}' (known: {', '.join(FIGURES)})")
    return [FIGURES[n] for n in names] if names else list(FIGURES.values())


def run_all(experiments: list[Experiment], jobs: int) -> Results:
    """Run each distinct experiment once, in worker processes when jobs > 1."""
    unique = list(dict.fromkeys(experiments))
    # longest first, so that the last worker does not start a long run alone
    unique.sort(key=lambda e: -len(e.workload.build().specs))
    bar = tqdm(total=len(unique), desc="experiments", unit="run")
    if jobs <= 1:
        results = {}
        for exp in unique:
            results[exp] = run_experiment(exp)
            bar.update()
    else:
        with ProcessPoolExecutor(jobs) as pool:
            futures = {exp: pool.submit(run_experiment, exp) for exp in unique}
            results = {}
            for exp, future in futures.items():
                results[exp] = future.result()
                bar.update()
    bar.close()
    return results


def render_figures(names: list[str] | None, out: Path, jobs: int = 0) -> list[Path]:
    """Regenerate figures into `out`; their key numbers are merged into out/numbers.json."""
    figures = select(names)
    for path in {p for f in figures for p in f.inputs}:
        data_file(path)  # a missing input is an error now, not after minutes of experiments
    out.mkdir(parents=True, exist_ok=True)
    results = run_all([e for f in figures for e in f.experiments], jobs or os.cpu_count() or 1)
    numbers_path = out / NUMBERS_FILE
    numbers = (
        json.loads(numbers_path.read_text()) if names and numbers_path.exists() else {}
    )  # all figures: start afresh
    written = []
    for figure in tqdm(figures, desc="figures", unit="fig"):
        numbers[figure.name] = figure.draw(results, out)
        if (out / f"{figure.name}.png").exists():
            written.append(out / f"{figure.name}.png")
    numbers_path.write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
    return written + [numbers_path]
