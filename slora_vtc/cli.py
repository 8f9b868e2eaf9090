"""`slora-vtc` command line: run | compare | replay | figures | list | calibrate | trace | generate | profile | serve | bench-http."""

import argparse
import sys
from pathlib import Path

import pandas as pd

from slora_vtc import metrics
from slora_vtc.errors import UserError
from slora_vtc.backends.registry import BACKENDS, get_backend
from slora_vtc.experiment import COSTS, Experiment, cost_function, run_experiment
from slora_vtc.memory import fits_alone
from slora_vtc.results import RunResult, write_results
from slora_vtc.sched import SCHEDULERS, Lift, build_scheduler
from slora_vtc.suites import SUITES, get_suite


def _experiment_args(p: argparse.ArgumentParser, suite: bool = True) -> None:
    if suite:
        p.add_argument("--suite", required=True, help="workload suite (see `slora-vtc list`)")
        p.add_argument("--trace", help="trace file for the `real` suite (default: the paper's LMSYS trace in the shared data folder)")
    p.add_argument("--backend", default="sim", choices=BACKENDS)
    p.add_argument("--pool-tokens", type=int, help="memory pool size in tokens (default: the suite's)")
    p.add_argument("--duration", type=float, help="workload duration in seconds (default: the suite's)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--cost", default="linear", choices=COSTS, help="service cost: linear (1 in, 2 out) or the profiled h")
    p.add_argument("--profile", help="cost-profile JSON to calibrate the simulator (and the profiled cost) with")
    p.add_argument("--lift", default=Lift.PAPER.value, choices=[Lift.PAPER.value, Lift.ARTIFACT.value], help="VTC counter lift rule")
    p.add_argument("--extra-charge-at-finish", action="store_true", help="reproduce the artifact's extra decode charge when a request finishes")
    p.add_argument("--adapters", type=int, help="LoRA adapters the clients share, client i using adapter i mod N (default: one per client; 0: none)")
    p.add_argument("--adapter-rank", type=int, default=8, help="rank of every LoRA adapter (default 8)")
    real = p.add_argument_group("real backends (torch, triton)")
    _model_args(real)
    real.add_argument("--time-scale", type=float, default=1.0, help="workload seconds per wall-clock second (e.g. 10: a 600 s suite in 60 s)")


def _model_args(p, backend: bool = False) -> None:
    if backend:
        p.add_argument("--backend", default="torch", choices=[b for b, e in BACKENDS.items() if e.runs_model])
    p.add_argument("--model", help="tiny | llama-7b | llama-2-7b | llama-13b (dummy weights) or a Hugging Face folder (default: tiny on torch, llama-7b on triton)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cpu for torch, cuda for triton)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="default: float32 on a CPU, float16 on a GPU")


def _experiment(args, scheduler: str) -> Experiment:
    exp = Experiment(
        suite=args.suite, scheduler=scheduler, pool_tokens=args.pool_tokens, duration=args.duration, seed=args.seed,
        cost=args.cost, lift=args.lift, extra_charge_at_finish=args.extra_charge_at_finish, profile=args.profile,
        backend=args.backend, trace=args.trace, model=args.model, adapters=args.adapters, adapter_rank=args.adapter_rank,
        time_scale=args.time_scale, device=args.device, dtype=args.dtype,
    )
    _check(exp)
    return exp


def _check(exp: Experiment) -> None:
    """Fail early, in one line, on input that could only fail deep inside a run."""
    get_suite(exp.suite)
    if exp.pool_tokens is not None and exp.pool_tokens <= 0:
        raise UserError(f"--pool-tokens must be positive, got {exp.pool_tokens}")
    _check_adapters(exp)
    workload = exp.workload()
    build_scheduler(exp.scheduler, list(workload.clients), exp.scheduler_options())
    requests, config = exp.requests(workload), exp.engine_config()
    if requests and not any(fits_alone(r, config) for r in requests):
        smallest = min(r.prompt_len + r.max_new_tokens for r in requests)
        raise UserError(f"a pool of {config.pool_tokens} tokens cannot hold a single request of suite '{exp.suite}' (the smallest needs {smallest} tokens plus adapter slots)")


def _check_adapters(exp: Experiment) -> None:
    if not exp.real_backend and (exp.model or exp.device or exp.dtype or exp.time_scale != 1.0):
        raise UserError("--model, --device, --dtype and --time-scale apply to the real backends (--backend torch or triton)")
    if exp.adapters is not None and exp.adapters < 0 or exp.adapter_rank < 0:
        raise UserError("--adapters and --adapter-rank must not be negative")
    if exp.time_scale <= 0:
        raise UserError(f"--time-scale must be positive, got {exp.time_scale}")
    config = exp.engine_config()  # on a real backend this reads the model spec: a bad --model fails here
    if exp.adapters != 0 and config.adapter_slots >= config.pool_tokens:
        raise UserError(f"an adapter of rank {exp.adapter_rank} takes {config.adapter_slots} pool slots, which does not fit a pool of {config.pool_tokens} tokens")


def summary_row(result: RunResult) -> dict:
    fair = metrics.fairness_summary(result, float(result.config.get("duration", 600)), cost_function(result.config.get("cost", "linear")))
    return {
        "scheduler": result.config.get("scheduler", "?"),
        "max_diff": fair.max, "avg_diff": fair.avg, "var_diff": fair.var,
        "throughput": metrics.throughput(result),
        "mean_response_s": metrics.mean_response_time(result),
        "finished": result.count("finished"), "rejected": result.count("rejected"), "aborted": result.count("aborted"),
    }


def cmd_run(args) -> int:
    exp = _experiment(args, args.scheduler)
    result = run_experiment(exp, progress=True)
    return _report(result, Path(args.out or f"results/{exp.suite}_{exp.scheduler.replace(':', '-')}.jsonl"))


def _report(result: RunResult, out: Path) -> int:
    """Write the result file and print its summary row."""
    write_results(out, [result])
    print(pd.DataFrame([summary_row(result)]).to_string(index=False, float_format="%.1f"))
    print(f"wrote {out}")
    return 0


def cmd_replay(args) -> int:
    args.suite, args.trace = "real", args.trace_file
    return cmd_run(args)


def cmd_trace_build(args) -> int:
    from slora_vtc.traces import write_trace
    from slora_vtc.traces.build import build_trace
    from slora_vtc.traces.tokenize import token_counter

    count, bos = token_counter(args.tokenizer)
    records, stats = build_trace(args.raw_file, args.rate, args.duration, count, bos, args.seed)
    write_trace(records, args.out)
    print(f"{stats.records} records, {stats.single_turn} single-turn chats, {stats.too_long} dropped (a length >= 1024), "
          f"{stats.sampled} requests from {stats.clients} clients sampled over {args.duration:g} s -> {args.out}")
    return 0


def cmd_compare(args) -> int:
    schedulers = [s for s in args.schedulers.split(",") if s]
    if not schedulers:
        raise UserError("--schedulers needs at least one scheduler")
    experiments = [_experiment(args, s) for s in schedulers]
    rows = [summary_row(run_experiment(exp, progress=True)) for exp in experiments]
    print(pd.DataFrame(rows).to_string(index=False, float_format="%.1f"))
    return 0


def cmd_list(args) -> int:
    print("suites:")
    for s in SUITES.values():
        print(f"  {s.name:22s} Fig {s.figure:3s} {s.description} ({s.duration:.0f} s, pool {s.pool_tokens})")
    print("schedulers:")
    for name, entry in SCHEDULERS.items():
        spec = f"{name}:{entry.arg}" if entry.arg else name
        print(f"  {spec:22s} {entry.help}")
    from slora_vtc.figures import FIGURES

    print("figures:")
    for f in FIGURES.values():
        print(f"  {f.name:22s} Fig {f.paper_figure:6s} {f.title}")
    return 0


def cmd_figures(args) -> int:
    from slora_vtc.figures import render_figures

    for path in render_figures(args.only.split(",") if args.only else None, Path(args.out), jobs=args.jobs):
        print(f"wrote {path}")
    return 0


def cmd_generate(args) -> int:
    from slora_vtc.model.sampling import SamplingParams
    from slora_vtc.realrun import generate

    prompts = [_ids(text) for text in args.prompt_ids]
    sampling = SamplingParams() if args.greedy else SamplingParams(args.temperature, args.top_k, args.top_p)
    outputs = generate(args.model or get_backend(args.backend).default_model, prompts, args.max_new_tokens, sampling, args.ignore_eos, args.backend,
                       args.device, args.dtype, args.seed, args.pool_tokens)
    for ids in outputs:
        print(",".join(map(str, ids)))
    return 0


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--prompt-ids takes comma-separated integers, got '{text}'") from None


def cmd_profile(args) -> int:
    from slora_vtc.profile import save_profile
    from slora_vtc.realrun import ARTIFACT_GRID, measure_profile

    if args.pool_tokens <= 0:
        raise UserError(f"--pool-tokens must be positive, got {args.pool_tokens}")
    grid = ARTIFACT_GRID
    if args.inputs or args.outputs:
        grid = tuple((i, o) for i in _ids(args.inputs or "8,64,256,512") for o in _ids(args.outputs or "1,64,128,256"))
    points = measure_profile(args.backend, args.model or get_backend(args.backend).default_model, args.pool_tokens,
                             grid, args.device, args.dtype, args.max_batch, progress=True)
    save_profile(points, args.out)
    rows = [{"input": p.input_len, "output": p.output_len, "batch": p.batch_size, "prefill_ms": 1000 * p.prefill_s,
             "decode_ms": 1000 * p.decode_s} for p in points]
    print(pd.DataFrame(rows).to_string(index=False, float_format="%.3f"))
    print(f"wrote {args.out}")
    return 0


def cmd_calibrate(args) -> int:
    from slora_vtc.calibrate import calibration_report

    print(calibration_report(args.profile, args.measured, args.scheduler))
    return 0


def cmd_serve(args) -> int:
    from slora_vtc.server.context import ServerConfig
    from slora_vtc.server.run import serve

    model = args.model or get_backend(args.backend).default_model
    serve(ServerConfig(model=model, scheduler=args.scheduler, clients_file=args.clients, host=args.host, port=args.port,
                       pool_tokens=args.pool_tokens, lora_rank=args.lora_rank, backend=args.backend, device=args.device,
                       dtype=args.dtype, seed=args.seed, tokenizer=args.tokenizer, drain_s=args.drain_timeout))
    return 0


def cmd_bench_http(args) -> int:
    from slora_vtc.server.bench import BenchConfig, run_bench

    result = run_bench(BenchConfig(args.trace_file, args.url, time_scale=args.time_scale, duration=args.duration,
                                   clients_file=args.clients))
    return _report(result, Path(args.out or f"results/http_{Path(args.trace_file).stem}.jsonl"))


def _serve_parsers(sub) -> None:
    srv = sub.add_parser("serve", help="serve the real model over HTTP (OpenAI API, S-LoRA's /generate) with a fair scheduler")
    _model_args(srv, backend=True)
    srv.add_argument("--scheduler", default="vtc", help="scheduler spec, as for `run` (default: vtc)")
    srv.add_argument("--clients", help="clients file (TOML): API keys, weights, RPM limits, LoRA adapters")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--pool-tokens", type=int, default=10_000, help="memory pool size in tokens (default 10000)")
    srv.add_argument("--lora-rank", type=int, default=8, help="rank of the clients' LoRA adapters (default 8; 0: no LoRA)")
    srv.add_argument("--tokenizer", help="tokenizer folder, or 'byte' (default: the model folder's tokenizer, else byte-level)")
    srv.add_argument("--drain-timeout", type=float, default=30.0, help="on SIGINT/SIGTERM, seconds to finish in-flight requests before aborting them")
    srv.add_argument("--seed", type=int, default=0, help="seed of dummy weights and of sampling")
    srv.set_defaults(func=cmd_serve)

    bench = sub.add_parser("bench-http", help="replay a trace against a server over HTTP; writes a result file")
    bench.add_argument("trace_file", help="the trace to replay (JSONL / CSV / the paper's JSON / the artifact's .pkl)")
    bench.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    bench.add_argument("--out", help="result file (default: results/http_TRACE.jsonl)")
    bench.add_argument("--time-scale", type=float, default=1.0, help="trace seconds per wall-clock second (e.g. 10: a 600 s trace in 60 s)")
    bench.add_argument("--duration", type=float, help="replay only the requests sent before this trace time (s)")
    bench.add_argument("--clients", help="clients file: send each client's API key instead of X-Client-Id")
    bench.set_defaults(func=cmd_bench_http)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slora-vtc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one experiment and write its result file")
    _experiment_args(run)
    run.add_argument("--scheduler", required=True, help="fcfs | rpm:LIMIT | lcf | vtc | wvtc:W1,W2,... | vtc-oracle | vtc-pred:R | vtc-avg")
    run.add_argument("--out", help="result file (default: results/SUITE_SCHEDULER.jsonl)")
    run.set_defaults(func=cmd_run)

    compare = sub.add_parser("compare", help="run several schedulers on one suite and print a table")
    _experiment_args(compare)
    compare.add_argument("--schedulers", required=True, help="comma-separated scheduler specs, e.g. vtc,fcfs,lcf")
    compare.set_defaults(func=cmd_compare)

    figures = sub.add_parser("figures", help="regenerate the paper's figures into figures/")
    figures.add_argument("--only", help="comma-separated figure names (see `slora-vtc list`)")
    figures.add_argument("--out", default="figures")
    figures.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per core)")
    figures.set_defaults(func=cmd_figures)

    replay = sub.add_parser("replay", help="replay a trace file (JSONL / CSV / the paper's JSON / the artifact's .pkl)")
    replay.add_argument("trace_file", help="the trace to replay")
    _experiment_args(replay, suite=False)
    replay.add_argument("--scheduler", required=True, help="scheduler spec, as for `run`")
    replay.add_argument("--out", help="result file (default: results/real_SCHEDULER.jsonl)")
    replay.set_defaults(func=cmd_replay)

    trace = sub.add_parser("trace", help="build a trace from Chatbot Arena conversation logs")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    build = trace_sub.add_parser("build", help="raw logs (JSON, JSONL or parquet) -> trace (JSONL, or CSV by extension)")
    build.add_argument("raw_file")
    build.add_argument("--rate", type=float, required=True, help="requests per second to sample")
    build.add_argument("--duration", type=float, required=True, help="seconds the sampled requests are spread over")
    build.add_argument("--out", required=True)
    build.add_argument("--tokenizer", help="local Hugging Face tokenizer folder (default: an approximate count)")
    build.add_argument("--seed", type=int, default=42)
    build.set_defaults(func=cmd_trace_build)

    gen = sub.add_parser("generate", help="generate token ids with the real model (one line per prompt, comma separated)")
    _model_args(gen, backend=True)
    gen.add_argument("--prompt-ids", action="append", required=True, help="comma-separated token ids; repeat for a batch")
    gen.add_argument("--max-new-tokens", type=int, default=16)
    gen.add_argument("--greedy", action="store_true", help="argmax decoding (otherwise: sample)")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0, help="0: off")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    gen.add_argument("--seed", type=int, default=0, help="seed of dummy weights and of sampling")
    gen.add_argument("--pool-tokens", type=int, help="memory pool in tokens (default: just enough)")
    gen.set_defaults(func=cmd_generate)

    prof = sub.add_parser("profile", help="measure prefill and decode time per request on this hardware; writes a cost profile")
    _model_args(prof, backend=True)
    prof.add_argument("--out", required=True, help="profile JSON (the format of the artifact's A10G profile)")
    prof.add_argument("--pool-tokens", type=int, default=10_000, help="pool size; pool // (input + output) requests run together")
    prof.add_argument("--inputs", help="comma-separated input lengths (default: the artifact's grid)")
    prof.add_argument("--outputs", help="comma-separated output lengths (default: the artifact's grid)")
    prof.add_argument("--max-batch", type=int, help="at most this many requests per point")
    prof.set_defaults(func=cmd_profile)

    _serve_parsers(sub)

    lst = sub.add_parser("list", help="name every suite, scheduler and figure")
    lst.set_defaults(func=cmd_list)

    cal = sub.add_parser("calibrate", help="fit the simulator to a cost profile; check it against a measured run")
    cal.add_argument("--profile", help="cost-profile JSON (default: the artifact's A10G profile)")
    cal.add_argument("--measured", action="append", default=[], help="a measured result file to replay (repeatable)")
    cal.add_argument("--scheduler", action="append", default=[], help="scheduler each measured run used, in order")
    cal.set_defaults(func=cmd_calibrate)
    return parser


# what requirements-real.txt adds to the simulator's requirements
REAL_ENGINE_PACKAGES = {"torch", "triton", "transformers", "safetensors", "fastapi", "uvicorn", "prometheus_client", "openai", "httpx2"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"slora-vtc: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        if e.name not in REAL_ENGINE_PACKAGES:
            raise
        print(f"slora-vtc: error: this command needs the real-engine packages ({e.name} is missing): "
              "pip install -r requirements-real.txt, or `make test`, which installs them into .venv", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("slora-vtc: interrupted", file=sys.stderr)
        return 130
