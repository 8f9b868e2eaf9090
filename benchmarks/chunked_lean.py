"""Our engine's chunked batching against lean implementations of the same step rule, and S-LoRA's
loop: is issue 20's speed item (chunked batching at least as fast per simulated request as S-LoRA's
loop; chunked_speed.py) out of reach of the rule itself, or of our engine's design?

The lean implementations simulate vLLM's step rule without the prefix cache, with the simulator's
step-time model, and nothing else (no memory manager, no request objects, no metrics but the times
compared):

- `lean`: LeanRule (lean_rule.py, FCFS), our engine's design stripped: single steps that visit every
  running request, macro-steps over the decode-only steps between events (O(running) per event);
  `lean_single_steps` the same without macro-steps.
- `event`: EventRule (event_rule.py, FCFS), event-driven: a decoding request's counts are offsets
  from a global tick, and what a tick needs of the decoding requests (who takes a block, who
  finishes when, their context) is kept as they start and stop, so that a tick where nothing
  happens costs a few additions and an event O(log running) or so. Under VTC, VTCRule
  (vtc_rule.py): our VTC scheduler decides, decode charges are kept per client between events.

Each suite's run must give every request the finish time, the first token's time and the number
of preemptions our engine gives it (checked, exit status 1 otherwise): all simulate the same
steps. The same check runs first on more suites and settings (`checked` in the results: both
schedulers, token budgets, block sizes, sequence caps and pools), untimed. Then each is timed on
the same prebuilt requests (our engine's `serve_requests`, the workload and the result file left
out), repeats interleaved, medians.

    .venv/bin/python benchmarks/chunked_lean.py               # 5 repeats, about 4 minutes
    .venv/bin/python benchmarks/chunked_lean.py --repeats 3 --suites overload --no-check

Results: benchmarks/results/chunked_lean.json (with the machine they ran on).
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from event_rule import EventRule  # noqa: E402 (benchmarks/ is not a package)
from lean_rule import LeanRule  # noqa: E402
from machine import machine_info  # noqa: E402
from vtc_rule import VTCRule  # noqa: E402

from slora_vtc.backends import build_backend  # noqa: E402
from slora_vtc.backends.sim import load_testbed  # noqa: E402
from slora_vtc.experiment import Experiment  # noqa: E402
from slora_vtc.request import Request  # noqa: E402
from slora_vtc.runner import serve_requests  # noqa: E402
from slora_vtc.sched import build_scheduler  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "chunked_lean.json"
SUITES = ("overload", "dist_shift", "real", "ablation_65k_256")
SCHEDULERS = ("fcfs", "vtc")
CHECKED_SUITES = ("overload", "real", "dist_shift", "on_off_overload", "poisson_short_long_2")
CHECKED_SETTINGS = (  # budget, block size, sequence cap, pool (None: the suite's)
    (2048, 16, 256, None),
    (256, 16, 256, None),
    (512, 4, 8, None),
    (64, 1, 256, 3000),
    (128, 8, 16, 40000),
    (32, 32, 4, None),
)


def fresh(requests: list[Request]) -> list[Request]:
    return [replace(r, output_ids=[], kv_slots=[], output_logprobs=[]) for r in requests]


def engine_run(exp: Experiment, requests: list[Request]) -> float:
    workload, config = exp.workload.build(), exp.engine_config()
    backend = build_backend(exp.backend.name, exp.backend_settings(config))
    scheduler = build_scheduler(exp.scheduling.scheduler, list(workload.clients), exp.scheduler_options())
    start = time.perf_counter()
    serve_requests(requests, scheduler, config, backend)
    return time.perf_counter() - start


def rule_run(make: Callable[[], LeanRule], requests: list[Request]) -> tuple[float, LeanRule]:
    rule = make()
    start = time.perf_counter()
    rule.run(requests)
    return time.perf_counter() - start, rule


def outcome(rule: LeanRule, requests: list[Request]) -> dict[int, tuple]:
    seqs = {s.rid: s for s in rule.seqs}
    return {r.rid: (rule.ends.get(r.rid), seqs[r.rid].first_token, seqs[r.rid].preemptions) for r in requests}


def lean_rules(exp: Experiment) -> dict[str, Callable[[], LeanRule]]:
    """The lean rules of the experiment's scheduler: under VTC, only the event-driven one (vtc_rule.py)."""
    config, model = exp.engine_config(), load_testbed(exp.backend.testbed)
    if exp.scheduling.scheduler == "vtc":
        clients, options = list(exp.workload.build().clients), exp.scheduler_options()
        return {"event": lambda: VTCRule(config, model, build_scheduler("vtc", clients, options))}
    return {
        "lean": lambda: LeanRule(config, model, macro=True),
        "lean_single_steps": lambda: LeanRule(config, model, macro=False),
        "event": lambda: EventRule(config, model),
    }


def check(exp: Experiment, requests: list[Request], label: str) -> dict[str, dict[str, float]]:
    """Each lean rule's outcome of every request against our engine's (exit 1 where one differs);
    returns each rule's events per request."""
    ours = fresh(requests)
    engine_run(exp, ours)
    expected = {r.rid: (r.finish_time, r.first_token_time, r.preemptions) for r in ours}
    events = {}
    for name, make in lean_rules(exp).items():
        _, rule = rule_run(make, fresh(requests))
        got = outcome(rule, requests)
        wrong = [rid for rid in expected if got[rid] != expected[rid]]
        if wrong:
            rid = wrong[0]
            sys.exit(f"{label}: {name} differs from our engine on {len(wrong)} requests, e.g. {rid}: {got[rid]}")
        events[name] = {kind: n / len(requests) for kind, n in rule.events.items()}
    return events


def check_settings() -> list[dict]:
    """check() on more suites and settings: budgets, block sizes, sequence caps and pools."""
    rows = []
    for scheduler in SCHEDULERS:
        for suite in CHECKED_SUITES:
            for budget, block, seqs, pool in CHECKED_SETTINGS:
                settings = dict(max_num_batched_tokens=budget, block_size=block, max_num_seqs=seqs)
                settings.update({"pool_tokens": pool} if pool else {})
                exp = Experiment.of(suite=suite, scheduler=scheduler, batching="chunked", **settings)
                check(exp, exp.requests(exp.workload.build()), f"{suite}/{scheduler} {settings}")
                rows.append({"suite": suite, "scheduler": scheduler, **settings, "identical": True})
    return rows


def measure(suite: str, scheduler: str, repeats: int) -> dict:
    exps = {b: Experiment.of(suite=suite, scheduler=scheduler, batching=b) for b in ("slora", "chunked")}
    exp = exps["chunked"]
    rules = lean_rules(exp)
    requests = exp.requests(exp.workload.build())
    events = check(exp, requests, suite)
    runs = {
        "slora": lambda: engine_run(exps["slora"], fresh(requests)),
        "chunked": lambda: engine_run(exp, fresh(requests)),
        **{name: (lambda make=make: rule_run(make, fresh(requests))[0]) for name, make in rules.items()},
    }
    loops = ("slora", "chunked", *rules)
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(repeats):
        for name in loops:
            samples[name].append(runs[name]())
    row = {
        "suite": suite,
        "scheduler": scheduler,
        "requests": len(requests),
        "identical": True,
        "events_per_request": events,
    }
    for name, values in samples.items():
        row[f"{name}_ms_per_request"] = 1000 * statistics.median(values) / len(requests)
        row[f"{name}_samples_s"] = [round(v, 4) for v in values]
    for name in loops[1:]:
        row[f"{name}_over_slora"] = row[f"{name}_ms_per_request"] / row["slora_ms_per_request"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--suites", nargs="+", default=list(SUITES))
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--no-check", action="store_true", help="skip the check on more suites and settings")
    args = parser.parse_args()
    checked = [] if args.no_check else check_settings()
    print(f"{len(checked)} more runs: every request's outcome as our engine's")
    rows = []
    print("S-LoRA's loop's ms per simulated request, and each loop's time as a multiple of it")
    for scheduler in SCHEDULERS:
        for suite in args.suites:
            rows.append(row := measure(suite, scheduler, args.repeats))
            cells = [f"slora {row['slora_ms_per_request']:.3f}"] + [
                f"{key[: -len('_over_slora')]} {row[key]:.2f}x" for key in row if key.endswith("_over_slora")
            ]
            print(f"{suite + '/' + scheduler:22} " + "  ".join(cells))
    results = {"machine": machine_info(), "repeats": args.repeats, "runs": rows}
    results |= {"checked_runs": len(checked), "checked": checked}
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
