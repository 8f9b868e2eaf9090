"""`run`, `compare`, `replay` and `list`: experiments on the simulator or a real backend."""

import argparse
import math
from pathlib import Path

from slora_vtc.backends.registry import BACKENDS
from slora_vtc.backends.sim import DEFAULT_TESTBED, TESTBEDS, load_testbed
from slora_vtc.cli.report import summary_table
from slora_vtc.cluster import ROUTERS, build_router
from slora_vtc.config import ADMISSIONS, BATCHINGS
from slora_vtc.errors import UserError
from slora_vtc.experiment import COSTS, Experiment, default_settings
from slora_vtc.memory import fits_alone
from slora_vtc.model.spec import resolve_spec
from slora_vtc.results import RunResult, check_writable, write_results
from slora_vtc.runner import router_options, run_experiment
from slora_vtc.sched import SCHEDULERS, Lift, build_scheduler, split_specs
from slora_vtc.suites import SUITES, get_suite


def scheduler_help() -> str:
    return " | ".join(e.usage(n) for n, e in SCHEDULERS.items())


def add_experiment_args(p: argparse.ArgumentParser, suite: bool = True) -> None:
    if suite:
        p.add_argument("--suite", required=True, help="workload suite (see `slora-vtc list`)")
        p.add_argument(
            "--trace", help="trace file for a trace suite (`real`; default: the paper's LMSYS trace in traces/)"
        )
    p.add_argument("--backend", default="sim", choices=list(BACKENDS))
    p.add_argument("--pool-tokens", type=int, help="memory pool size in tokens (default: the suite's)")
    p.add_argument("--duration", type=float, help="seconds of arrivals (default: the suite's)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--load-scale",
        type=int,
        default=1,
        help="send every request of the workload this many times (e.g. N for a cluster of N replicas)",
    )
    p.add_argument(
        "--horizon",
        type=float,
        help="stop at this many seconds and abort what has not finished (default: serve every request)",
    )
    p.add_argument(
        "--cost", default="linear", choices=COSTS, help="service cost: linear (1 in, 2 out) or the profiled h"
    )
    p.add_argument(
        "--profile", help="cost-profile JSON to refit the simulator's forward pass (and the profiled cost) to"
    )
    p.add_argument(
        "--testbed",
        default=DEFAULT_TESTBED,
        help=f"the simulator's testbed: {', '.join(TESTBEDS)} (default {DEFAULT_TESTBED}), "
        "or a file from `slora-vtc calibrate --out`",
    )
    p.add_argument(
        "--jitter-ms",
        type=float,
        default=0.0,
        help="delay each arrival by up to this many ms (uniform, seeded by --seed): one member of an ensemble",
    )
    p.add_argument(
        "--added-tokens",
        type=int,
        default=1,
        help="tokens the serving path adds to every prompt "
        "(default 1: the artifact's server puts a BOS before the client's text)",
    )
    p.add_argument(
        "--lift",
        default=Lift.PAPER.value,
        choices=[Lift.PAPER.value, Lift.ARTIFACT.value, Lift.RUNNING.value],
        help="VTC counter lift rule (running: a client with a request running keeps one request's credit)",
    )
    p.add_argument(
        "--extra-charge-at-finish",
        action="store_true",
        help="reproduce the artifact's extra decode charge when a request finishes",
    )
    p.add_argument(
        "--dummy-adapters",
        "--adapters",
        dest="adapters",
        type=int,
        help="N dummy LoRA adapters (dummy-0 ..), client i using adapter i mod N "
        "(default: one per client on the simulator, none on a real backend; 0: none)",
    )
    p.add_argument("--adapter-rank", type=int, default=8, help="rank of the dummy LoRA adapters (default 8)")
    add_memory_args(p)
    add_batching_args(p)
    add_cluster_args(p)
    real = p.add_argument_group("real backends (torch, triton)")
    add_model_args(real)
    add_lora_arg(real)
    real.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="workload seconds per wall-clock second (e.g. 10: a 600 s suite in 60 s)",
    )


def add_memory_args(p) -> None:
    """The prefix cache, the admission rule and how VTC charges cached and recomputed tokens."""
    p.add_argument(
        "--prefix-cache",
        choices=["on", "off"],
        default="off",
        help="share the K/V of common prompt prefixes through a radix tree in the pool "
        "(default off: the paper's engine); under --batching chunked, as vLLM's prefix cache, a "
        "preempted request also finds its own K/V again",
    )
    p.add_argument(
        "--admission",
        choices=list(ADMISSIONS),
        default="conservative",
        help="conservative: reserve each request's worst case (S-LoRA, the paper); "
        "optimistic: admit while slots are free and preempt by recompute when a decode step runs short (vLLM)",
    )
    p.add_argument(
        "--charge-cached",
        type=float,
        default=1.0,
        help="VTC: weight of a cached prompt token in its counter, in [0, 1] "
        "(default 1: the paper's VTC; 0: extend tokens only)",
    )
    p.add_argument(
        "--charge-recompute", action="store_true", help="VTC: charge again the tokens a preempted request recomputes"
    )


def add_batching_args(p) -> None:
    """S-LoRA's loop or vLLM's chunked prefill, and the latter's budget, sequence cap and block size."""
    b = p.add_argument_group("batching")
    b.add_argument(
        "--batching",
        choices=list(BATCHINGS),
        default="slora",
        help="slora: separate prefill and decode passes, new requests every 10 decode steps (S-LoRA, the paper); "
        "chunked: vLLM's steps, a token budget shared by decodes and prompt chunks, memory in blocks",
    )
    b.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="chunked: tokens one step computes (default 2048, vLLM's on a GPU)",
    )
    b.add_argument(
        "--max-num-seqs", type=int, default=256, help="chunked: requests running at once (default 256, vLLM's)"
    )
    b.add_argument("--block-size", type=int, default=16, help="chunked: tokens per KV block (default 16, vLLM's)")


def batching_settings(args) -> dict:
    return dict(
        batching=args.batching,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
    )


def router_help() -> str:
    return " | ".join(e.usage(n) for n, e in ROUTERS.items())


def add_cluster_args(p) -> None:
    """Several replicas behind a router (simulator only)."""
    c = p.add_argument_group("a cluster of replicas (simulator)")
    c.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engines behind the router, each with its own pool, scheduler and clock (default 1)",
    )
    c.add_argument("--router", default="round-robin", help=f"{router_help()} (default round-robin)")
    c.add_argument(
        "--routers",
        type=int,
        default=1,
        help="global-vtc: router instances, each with its own queues and counters (default 1)",
    )
    c.add_argument(
        "--router-sync",
        type=float,
        help="seconds between the routers' counter synchronisations (default: never; 0: always)",
    )
    c.add_argument(
        "--ingress-skew",
        type=float,
        default=0.0,
        help="share of a client's requests entering by its home router, the rest in turn "
        "(default 0; 1: each client by one router)",
    )
    c.add_argument(
        "--replica-pool-tokens",
        type=_int_list,
        default=(),
        metavar="N,N,...",
        help="pool of replica i: entry i mod the list's length",
    )
    c.add_argument(
        "--replica-testbeds",
        type=_str_list,
        default=(),
        metavar="T,T,...",
        help="testbed of replica i: entry i mod the list's length",
    )


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got '{text}'") from None


def _str_list(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got '{text}'")
    return names


def add_model_args(p, backend: bool = False) -> None:
    if backend:
        p.add_argument("--backend", default="torch", choices=[b for b, e in BACKENDS.items() if e.runs_model])
    p.add_argument(
        "--model",
        help="tiny | llama-7b | llama-2-7b | llama-13b (dummy weights) or a Hugging Face folder "
        "(default: the backend's)",
    )
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cpu for torch, cuda for triton)")
    p.add_argument(
        "--dtype", choices=["float32", "float16", "bfloat16"], help="default: float32 on a CPU, float16 on a GPU"
    )


def add_lora_arg(p) -> None:
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors); repeat for more",
    )


def add_adapter_args(p) -> None:
    """--lora, --dummy-adapters, --adapter-rank: the adapters a real model serves."""
    add_lora_arg(p)
    p.add_argument(
        "--dummy-adapters",
        type=int,
        default=0,
        help="also N dummy adapters with random weights, named dummy-0 .. dummy-N-1",
    )
    p.add_argument("--adapter-rank", type=int, default=8, help="rank of the dummy adapters (default 8)")


def experiment(args, scheduler: str) -> Experiment:
    exp = Experiment.of(
        suite=args.suite,
        scheduler=scheduler,
        pool_tokens=args.pool_tokens,
        duration=args.duration,
        seed=args.seed,
        cost=args.cost,
        lift=args.lift,
        extra_charge_at_finish=args.extra_charge_at_finish,
        profile=args.profile,
        testbed=args.testbed,
        added_tokens=args.added_tokens,
        jitter_ms=args.jitter_ms,
        backend=args.backend,
        trace=args.trace,
        model=args.model,
        adapters=args.adapters,
        adapter_rank=args.adapter_rank,
        lora=tuple(args.lora),
        time_scale=args.time_scale,
        device=args.device,
        dtype=args.dtype,
        horizon=args.horizon,
        load_scale=args.load_scale,
        prefix_cache=args.prefix_cache == "on",
        admission=args.admission,
        charge_cached=args.charge_cached,
        charge_recompute=args.charge_recompute,
        **batching_settings(args),
        **cluster_settings(args),
    )
    check(exp)
    return exp


def cluster_settings(args) -> dict:
    """The cluster flags. Without a cluster (one replica, one router) the others would be ignored: each
    given then is refused by name (a sweep's grid may pair them with replicas = 1; a command line not)."""
    if args.replicas == 1 and args.routers == 1:
        given = {
            "--router": args.router != "round-robin",
            "--router-sync": args.router_sync is not None,
            "--ingress-skew": args.ingress_skew != 0,
            "--replica-pool-tokens": bool(args.replica_pool_tokens),
            "--replica-testbeds": bool(args.replica_testbeds),
        }
        if flags := [flag for flag, set_ in given.items() if set_]:
            verb = "applies" if len(flags) == 1 else "apply"
            raise UserError(f"{', '.join(flags)} {verb} only to a cluster: give --replicas N or --routers N (N > 1)")
    return dict(
        replicas=args.replicas,
        router=args.router,
        routers=args.routers,
        router_sync=args.router_sync,
        ingress_skew=args.ingress_skew,
        replica_pool_tokens=tuple(args.replica_pool_tokens),
        replica_testbeds=tuple(args.replica_testbeds),
    )


def check_cluster(exp: Experiment) -> None:
    cluster = exp.cluster
    if cluster.replicas < 1:
        raise UserError(f"--replicas must be at least 1, got {cluster.replicas}")
    if cluster.routers < 1:
        raise UserError(f"--routers must be at least 1, got {cluster.routers}")
    if cluster.router_sync is not None and not cluster.router_sync >= 0:
        raise UserError(f"--router-sync must not be negative, got {cluster.router_sync}")
    if not 0 <= cluster.ingress_skew <= 1:
        raise UserError(f"--ingress-skew must be in [0, 1], got {cluster.ingress_skew}")
    if any(p <= 0 for p in cluster.pool_tokens):
        raise UserError("--replica-pool-tokens: every pool must be positive")
    build_router(cluster.router, router_options(exp, exp.workload.build()))
    if cluster.clustered and exp.backend.real:
        raise UserError("--replicas and --routers run on the simulator only (--backend sim)")
    for testbed in cluster.testbeds:
        load_testbed(testbed)


def check(exp: Experiment) -> None:
    """Fail early, in one line, on input that could only fail deep inside a run."""
    suite = exp.workload.suite
    get_suite(suite)
    check_cluster(exp)
    _check_workload(exp)
    if exp.memory.pool_tokens is not None and exp.memory.pool_tokens <= 0:
        raise UserError(f"--pool-tokens must be positive, got {exp.memory.pool_tokens}")
    _check_real_options(exp)
    if not exp.backend.real:
        load_testbed(exp.backend.testbed)
    workload = exp.workload.build()
    scheduler = build_scheduler(exp.scheduling.scheduler, list(workload.clients), exp.scheduler_options())
    requests, config = exp.requests(workload), max(exp.replica_configs(), key=lambda c: c.pool_tokens)
    if requests and not any(fits_alone(r, config) for r in requests):
        smallest = min(r.prompt_len + r.max_new_tokens for r in requests)
        raise UserError(
            f"a pool of {config.pool_tokens} tokens cannot hold a single request of suite '{suite}' "
            f"(the smallest needs {smallest} tokens plus adapter slots)"
        )
    if config.admission == "optimistic":
        _check_optimistic(exp, requests, config, scheduler.traits.preemption)
    if config.chunked and not scheduler.traits.preemption:
        raise UserError(
            f"--batching chunked: scheduler '{exp.scheduling.scheduler}' cannot take preempted requests back"
        )


def _check_workload(exp: Experiment) -> None:
    workload = exp.workload
    if workload.load_scale < 1:
        raise UserError(f"--load-scale must be at least 1, got {workload.load_scale}")
    if workload.horizon is not None and not 0 < workload.horizon < math.inf:
        raise UserError(f"--horizon must be positive and finite, got {workload.horizon}")


def _check_optimistic(exp: Experiment, requests, config, preemptible: bool) -> None:
    """Optimistic admission must be able to finish any request alone (else preemption could loop)."""
    too_big = [r for r in requests if not fits_alone(r, config)]
    if too_big:
        r = max(too_big, key=lambda r: r.prompt_len + r.max_new_tokens)
        raise UserError(
            f"--admission optimistic: a pool of {config.pool_tokens} tokens is too small for one request of suite "
            f"'{exp.workload.suite}' ({len(too_big)} cannot fit alone; the largest needs "
            f"{r.prompt_len + r.max_new_tokens} tokens plus adapter slots)"
        )
    if not preemptible:
        raise UserError(
            f"--admission optimistic: scheduler '{exp.scheduling.scheduler}' cannot take preempted requests back"
        )


def _check_real_options(exp: Experiment) -> None:
    backend, workload, memory = exp.backend, exp.workload, exp.memory
    if not backend.real and (backend.model or backend.device or backend.dtype or backend.time_scale != 1.0):
        raise UserError(
            "--model, --device, --dtype and --time-scale apply to the real backends (--backend torch or triton)"
        )
    if backend.real and backend.testbed != DEFAULT_TESTBED:
        raise UserError("--testbed applies to the simulator (--backend sim); a real backend measures its own steps")
    if workload.added_tokens < 0:
        raise UserError(f"--added-tokens must not be negative, got {workload.added_tokens}")
    if not 0 <= workload.jitter_ms < math.inf:
        raise UserError(f"--jitter-ms must be a finite number >= 0, got {workload.jitter_ms}")
    if memory.adapters is not None and memory.adapters < 0 or memory.adapter_rank <= 0:
        raise UserError("--dummy-adapters must not be negative and --adapter-rank must be positive")
    if not 0 < backend.time_scale < math.inf:
        raise UserError(f"--time-scale must be positive and finite, got {backend.time_scale}")
    config = exp.engine_config()  # on a real backend this reads the model spec and the adapters: bad ones fail here
    if backend.real:  # before the check below, whose message would not name the adapter
        exp.adapter_table.check_fits(resolve_spec(backend.model_name), config.pool_tokens)
    elif memory.adapters != 0 and config.adapter_slots >= config.pool_tokens:
        raise UserError(
            f"an adapter of rank {memory.adapter_rank} takes {config.adapter_slots} pool slots, "
            f"which does not fit a pool of {config.pool_tokens} tokens"
        )


def result_name(exp: Experiment) -> str:
    """A result file name that says what differs from the defaults, so that runs do not collide."""
    settings, defaults = exp.flat(), default_settings()
    workload = f"replay-{Path(exp.workload.trace).stem}" if exp.workload.trace else exp.workload.suite
    parts = [workload, exp.scheduling.scheduler.replace(":", "-").replace(",", "_")]
    for name, default in defaults.items():
        value = settings[name]
        if value == default or name == "trace":
            continue
        if name == "profile":
            value = Path(value).stem
        if name == "lora":
            value = "+".join(v.partition("=")[0] for v in value)
        elif isinstance(value, tuple):  # --replica-pool-tokens, --replica-testbeds
            value = "+".join(Path(str(v)).stem for v in value)
        parts.append(name.replace("_", "-") if value is True else f"{name.replace('_', '-')}-{value}".replace("/", "_"))
    return "_".join(parts) + ".jsonl"


def report(results: list[RunResult], out: Path | None) -> int:
    """Print the summary; write the result file (one line per run) when `out` is given."""
    print(summary_table(results))
    if out is not None:
        write_results(out, results)
        print(f"wrote {out}")
    return 0


def cmd_run(args) -> int:
    exp = experiment(args, args.scheduler)
    out = Path(args.out) if args.out else Path("results") / result_name(exp)
    check_writable(out)
    return report([run_experiment(exp, progress=True, step_log=args.step_log)], out)


def cmd_replay(args) -> int:
    path = Path(args.trace_file)
    if path.is_dir():
        raise UserError(
            f"{path}: is a directory; replay takes a trace file "
            "(JSONL, CSV, parquet, the paper's JSON or the artifact's .pkl)"
        )
    args.suite, args.trace = "real", args.trace_file
    return cmd_run(args)


def cmd_compare(args) -> int:
    schedulers = split_specs(args.schedulers)
    if not schedulers:
        raise UserError("--schedulers needs at least one scheduler")
    experiments = [experiment(args, s) for s in schedulers]
    out = Path(args.out) if args.out else None
    if out is not None:
        check_writable(out)
    return report([run_experiment(exp, progress=True) for exp in experiments], out)


def cmd_list(args) -> int:
    from slora_vtc.figures import FIGURES

    print("suites:")
    for s in SUITES.values():
        print(f"  {s.name:22s} Fig {s.figure:3s} {s.description} ({s.duration:.0f} s, pool {s.pool_tokens})")
    print("schedulers:")
    for name, entry in SCHEDULERS.items():
        print(f"  {entry.usage(name):22s} {entry.help}")
    print("routers (--replicas N --router SPEC):")
    for name, entry in ROUTERS.items():
        print(f"  {entry.usage(name):22s} {entry.help}")
    print("backends:")
    for name, entry in BACKENDS.items():
        print(f"  {name:22s} {entry.help}")
    print("figures:")
    for f in FIGURES.values():
        print(f"  {f.name:22s} Fig {f.paper_figure:6s} {f.title}")
    return 0


def add_step_log_arg(p) -> None:
    p.add_argument(
        "--step-log",
        metavar="PATH",
        help="write one JSON line per engine step (the format of the vLLM plugin's step log, docs/vllm.md): "
        "what it prefilled and decoded, its time (simulated on the simulator)",
    )


def add_parsers(sub) -> None:
    run = sub.add_parser("run", help="run one experiment and write its result file")
    add_experiment_args(run)
    run.add_argument("--scheduler", required=True, help=scheduler_help())
    run.add_argument("--out", help="result file (default: results/ and a name built from the settings)")
    add_step_log_arg(run)
    run.set_defaults(func=cmd_run)

    compare = sub.add_parser("compare", help="run several schedulers on one suite and print a table")
    add_experiment_args(compare)
    compare.add_argument(
        "--schedulers",
        required=True,
        nargs="+",
        metavar="SPEC",
        help="scheduler specs separated by spaces (vtc fcfs wvtc:1,2,3,4), "
        "or by commas where no spec has one (vtc,fcfs,lcf)",
    )
    compare.add_argument("--out", help="also write the runs to this result file (one line per scheduler)")
    compare.set_defaults(func=cmd_compare)

    replay = sub.add_parser(
        "replay", help="replay a trace file (JSONL / CSV / parquet / the paper's JSON / the artifact's .pkl)"
    )
    replay.add_argument("trace_file", help="the trace to replay")
    add_experiment_args(replay, suite=False)
    replay.add_argument("--scheduler", required=True, help="scheduler spec, as for `run`")
    replay.add_argument("--out", help="result file (default: results/replay-TRACE_SCHEDULER....jsonl)")
    add_step_log_arg(replay)
    replay.set_defaults(func=cmd_replay)

    lst = sub.add_parser("list", help="name every suite, scheduler, backend and figure")
    lst.set_defaults(func=cmd_list)
