"""Benchmarks of slora_vtc on the CPU: simulator speed, scheduler overhead, figure rendering.

    .venv/bin/python benchmarks/run.py                 # everything (make bench), ~4 minutes on 2 cores
    .venv/bin/python benchmarks/run.py --quick         # smoke run, ~6 s, no figures, no model vs transformers
    .venv/bin/python benchmarks/run.py --only select   # one section (comma-separated list allowed)

Full runs write benchmarks/results/cpu.json (--quick: cpu-quick.json); --only updates just its
sections of that file. See benchmarks/README.md for what each number means.
"""

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import figures_time
import model_vs_hf
import numpy as np
import sched_overhead as so
import sim_speed
from machine import machine_info
from tqdm import tqdm

RESULTS = Path(__file__).resolve().parent / "results"
SCHEDULERS = ("vtc", "fcfs", "lcf")
CLIENT_COUNTS = (10, 1_000, 10_000)
RUNNING_SIZES = (20, 200)
SELECT_TARGET_US = 20.0  # VTC admission with 10,000 waiting clients, per admitted request
MAX_GROWTH = 10.0  # 10 -> 10,000 clients; linear growth would be about 1000x


@dataclass(frozen=True)
class Settings:
    sim_repeats: int
    repeats: int  # of every micro-benchmark; the median is reported
    admissions: int  # requests admitted per select measurement
    calls: int  # try_add / on_decode_step calls per measurement
    model_grid: model_vs_hf.Grid  # batches and contexts of our model vs transformers


FULL = Settings(sim_repeats=3, repeats=7, admissions=2_000, calls=2_000, model_grid=model_vs_hf.Grid())
QUICK = Settings(sim_repeats=1, repeats=3, admissions=300, calls=300, model_grid=model_vs_hf.QUICK)
FULL_ONLY = ("figures", "model", "macro")  # sections --quick leaves out unless --only names them


# -- sections -------------------------------------------------------------------------------
def bench_sim(s: Settings) -> list[dict]:
    return sim_speed.measure_sim_speed(s.sim_repeats)


def bench_macro(s: Settings) -> dict:
    return sim_speed.check_macro_steps()


def bench_cli(s: Settings) -> dict:
    return sim_speed.measure_cli(s.repeats)


def bench_select(s: Settings) -> list[dict]:
    rows = []
    cases = [(spec, clients) for spec in SCHEDULERS for clients in CLIENT_COUNTS]
    for spec, clients in tqdm(cases, desc="select overhead", leave=False):
        samples = [so.select_cost(spec, clients, s.admissions) for _ in range(s.repeats)]
        ns_per_admitted = [ns for ns, _ in samples]
        empty_ns, empty_samples = so.median_of(s.repeats, partial(so.empty_select_cost, spec, clients, s.calls))
        rows.append(
            {
                "scheduler": spec,
                "clients": clients,
                "us_per_admitted": statistics.median(ns_per_admitted) / 1e3,
                "admitted_per_call": samples[0][1],
                "samples_us": [ns / 1e3 for ns in ns_per_admitted],
                "us_per_empty_call": empty_ns / 1e3,
                "empty_samples_us": [ns / 1e3 for ns in empty_samples],
            }
        )
    return rows


def bench_try_add(s: Settings) -> list[dict]:
    rows = []
    for size in RUNNING_SIZES:
        median_ns, samples = so.median_of(s.repeats, partial(so.try_add_cost, size, s.calls))
        rows.append(
            {
                "running": size,
                "pool_tokens": so.pool_for(size),
                "us_per_call": median_ns / 1e3,
                "samples_us": [ns / 1e3 for ns in samples],
            }
        )
    return rows


def bench_decode(s: Settings) -> list[dict]:
    rows = []
    for spec in SCHEDULERS:
        for size in RUNNING_SIZES:
            median_ns, samples = so.median_of(s.repeats, partial(so.decode_step_cost, spec, size, s.calls))
            rows.append(
                {"scheduler": spec, "running": size, "ns_per_running_request": median_ns, "samples_ns": samples}
            )
    return rows


def bench_figures(s: Settings) -> dict:
    return figures_time.measure_figures()


def bench_model(s: Settings) -> dict:
    return model_vs_hf.measure(s.model_grid)


SECTIONS: dict[str, Callable[[Settings], object]] = {
    "sim": bench_sim,
    "macro": bench_macro,
    "cli": bench_cli,
    "select": bench_select,
    "try_add": bench_try_add,
    "decode": bench_decode,
    "figures": bench_figures,
    "model": bench_model,
}


# -- machine and targets --------------------------------------------------------------------
def target_checks(results: dict) -> list[dict]:
    checks = []
    vtc = {r["clients"]: r["us_per_admitted"] for r in results.get("select", []) if r["scheduler"] == "vtc"}
    if 10_000 in vtc:
        checks.append(
            {
                "target": f"VTC select, 10,000 clients < {SELECT_TARGET_US:g} us/admitted",
                "measured": f"{vtc[10_000]:.2f} us",
                "ok": vtc[10_000] < SELECT_TARGET_US,
            }
        )
    if 10 in vtc and 10_000 in vtc:
        growth = vtc[10_000] / vtc[10]
        checks.append(
            {
                "target": f"VTC select cost growth 10 -> 10,000 clients < {MAX_GROWTH:g}x (linear: ~1000x)",
                "measured": f"{growth:.2f}x",
                "ok": growth < MAX_GROWTH,
            }
        )
    decode = {(r["batch"], r["context"]): r["decode_ratio"] for r in results.get("model", {}).get("rows", [])}
    if (64, 512) in decode:
        checks.append(
            {
                "target": f"decode, batch 64, context 512: ours / transformers >= {model_vs_hf.TARGET_DECODE_RATIO:g}",
                "measured": f"{decode[64, 512]:.2f}x",
                "ok": decode[64, 512] >= model_vs_hf.TARGET_DECODE_RATIO,
            }
        )
    fig = results.get("figures")
    if fig:
        ok = fig.get("status") == "ok" and fig["wall_s"] < figures_time.TARGET_S
        measured = f"{fig['wall_s']:.1f} s ({fig['status']})" if "wall_s" in fig else fig["status"]
        checks.append(
            {
                "target": f"slora-vtc figures < {figures_time.TARGET_S:g} s",
                "measured": measured,
                "ok": ok if fig.get("status") != "not available" else None,
            }
        )
    cli = results.get("cli")
    if cli:
        checks.append(
            {
                "target": f"{cli['command']}, whole process < {cli['target_s']:g} s",
                "measured": f"{cli['wall_s']:.2f} s",
                "ok": cli["wall_s"] < cli["target_s"],
            }
        )
    macro = results.get("macro")
    if macro:
        checks.append(
            {
                "target": "macro-steps: the result file of single steps, on every suite",
                "ok": macro["identical"] == macro["cases"],
                "measured": f"{macro['identical']} / {macro['cases']} identical",
            }
        )
    return checks


def by_name(results: dict) -> dict:
    """The rows keyed by what they measure, for the docs to quote (benchmarks/README.md)."""
    keyed = {
        "sim": {f"{r['suite']} {r['scheduler']}": r for r in results.get("sim", [])},
        "select": {f"{r['scheduler']} {r['clients']}": r for r in results.get("select", [])},
        "try_add": {str(r["running"]): r for r in results.get("try_add", [])},
        "decode": {f"{r['scheduler']} {r['running']}": r for r in results.get("decode", [])},
        "model": {f"{r['batch']} {r['context']}": r for r in results.get("model", {}).get("rows", [])},
    }
    vtc = keyed["select"]
    if "vtc 10" in vtc and "vtc 10000" in vtc:
        keyed["vtc_growth"] = vtc["vtc 10000"]["us_per_admitted"] / vtc["vtc 10"]["us_per_admitted"]
    return keyed


# -- output ---------------------------------------------------------------------------------
def print_table(title: str, headers: list[str], rows: list[list]) -> None:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    print(f"\n{title}")
    for k, row in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if k == 0:
            print("  " + "  ".join("-" * w for w in widths))


def print_sim(rows: list[dict]) -> None:
    print_table(
        "Simulator speed (run_experiment, median wall time; single steps: one run)",
        ["suite", "scheduler", "requests", "simulated s", "wall s", "requests/s", "x real time", "single steps s"],
        [
            [
                r["suite"],
                r["scheduler"],
                r["requests"],
                f"{r['simulated_s']:.0f}",
                f"{r['wall_s']:.2f}",
                f"{r['requests_per_s']:,.0f}",
                f"{r['speedup']:.0f}",
                f"{r.get('single_steps_wall_s', float('nan')):.2f}",
            ]
            for r in rows
        ],
    )


def print_macro(check: dict) -> None:
    print(
        f"\nMacro-steps vs single steps: {check['identical']} of {check['cases']} runs identical; "
        f"{check['wall_s']:.1f} s vs {check['single_steps_wall_s']:.1f} s of simulation"
    )
    for r in check["rows"]:
        if not r["identical"]:
            print(f"  DIFFERENT: {r}")


def print_cli(cli: dict) -> None:
    print(f"\n{cli['command']} (whole process, median): {cli['wall_s']:.2f} s wall, {cli['cpu_s']:.2f} s CPU")


def print_select(rows: list[dict]) -> None:
    print_table(
        "select() per admitted request (pool 10k, 20 running, 256/256 requests)",
        ["scheduler", "waiting clients", "us/admitted", "admitted/call", "us/call admitting none"],
        [
            [
                r["scheduler"],
                f"{r['clients']:,}",
                f"{r['us_per_admitted']:.2f}",
                f"{r['admitted_per_call']:.1f}",
                f"{r['us_per_empty_call']:.2f}",
            ]
            for r in rows
        ],
    )


def print_try_add(rows: list[dict]) -> None:
    print_table(
        "Budget.try_add alone (accepted candidate, fresh budget)",
        ["running", "pool tokens", "us/call"],
        [[r["running"], f"{r['pool_tokens']:,}", f"{r['us_per_call']:.2f}"] for r in rows],
    )


def print_decode(rows: list[dict]) -> None:
    print_table(
        "on_decode_step per running request",
        ["scheduler", "running", "ns/request"],
        [[r["scheduler"], r["running"], f"{r['ns_per_running_request']:.1f}"] for r in rows],
    )


def print_figures(fig: dict) -> None:
    detail = f"{fig['wall_s']:.1f} s, {fig.get('files', 0)} files" if "wall_s" in fig else fig.get("reason", "")
    print(f"\nslora-vtc figures: {fig['status']} ({detail})")


def print_model(result: dict) -> None:
    print("\nOur model vs transformers (tokens/s)\n" + model_vs_hf.markdown_table(result))


PRINTERS: dict[str, Callable] = {
    "sim": print_sim,
    "macro": print_macro,
    "cli": print_cli,
    "select": print_select,
    "try_add": print_try_add,
    "decode": print_decode,
    "figures": print_figures,
    "model": print_model,
}


def print_results(results: dict) -> None:
    m = results["machine"]
    print(
        f"\n{m['date']}  {m['cpu_model']}  ({m['cpus_usable']} usable CPUs)  "
        f"Python {m['python']}  numpy {m['numpy']}  [{results['mode']}]"
    )
    for name, printer in PRINTERS.items():
        if name in results:
            printer(results[name])
    verdict = {True: "PASS", False: "MISS", None: "n/a"}
    checks = results["targets"]
    if checks:
        print_table(
            "Targets", ["target", "measured", ""], [[c["target"], c["measured"], verdict[c["ok"]]] for c in checks]
        )


def model_table(out: Path) -> Path:
    """The markdown table of the model section, beside the result file (benchmarks/README.md includes
    cpu_model_vs_hf.md)."""
    return out.with_name(f"{out.stem}_model_vs_hf.md")


def load_previous(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and calls, no figures: a smoke run")
    p.add_argument("--only", help=f"comma-separated sections to run: {', '.join(SECTIONS)}")
    p.add_argument(
        "--out", type=Path, help="result file (default: results/cpu.json, results/cpu-quick.json with --quick)"
    )
    args = p.parse_args(argv)
    args.sections = selected_sections(p, args)
    args.out = args.out or RESULTS / ("cpu-quick.json" if args.quick else "cpu.json")
    return args


def selected_sections(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    if not args.only:
        return [name for name in SECTIONS if not (args.quick and name in FULL_ONLY)]
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        p.error(f"--only: unknown section(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(SECTIONS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    results = load_previous(args.out) if args.only else {}
    results.update(machine=machine_info(numpy=np.__version__), mode="quick" if args.quick else "full")
    for name in args.sections:
        results[name] = SECTIONS[name](settings)
        results.setdefault("measured_at", {})[name] = results["machine"]["date"]
    results["targets"] = target_checks(results)
    results["by_name"] = by_name(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    if "model" in results:
        model_table(args.out).write_text(model_vs_hf.markdown_table(results["model"]))
    print_results(results)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
