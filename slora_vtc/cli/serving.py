"""`serve` (the real engine over HTTP) and `bench-http` (replay a trace against a server)."""

import argparse
from pathlib import Path

from slora_vtc.backends.registry import get_backend
from slora_vtc.cli.experiments import (
    add_adapter_args,
    add_batching_args,
    add_model_args,
    add_step_log_arg,
    batching_settings,
    report,
)
from slora_vtc.cli.front_door import add_front_door_args, front_door_settings
from slora_vtc.serving.front_door import SERVER_PORT


def cmd_serve(args) -> int:
    from slora_vtc.server.context import ServerConfig
    from slora_vtc.server.run import serve

    model = args.model or get_backend(args.backend).default_model
    serve(
        ServerConfig(
            model=model,
            served_model_names=tuple(args.served_model_name),
            scheduler=args.scheduler,
            pool_tokens=args.pool_tokens,
            lora=tuple(args.lora),
            dummy_adapters=args.dummy_adapters,
            adapter_rank=args.adapter_rank,
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            seed=args.seed,
            tokenizer=args.tokenizer,
            max_client_labels=args.max_client_labels,
            max_inflight=args.max_inflight,
            backlog=args.backlog,
            prefix_cache=args.prefix_cache,
            engine_process=args.engine_process,
            step_log=args.step_log,
            **batching_settings(args),
            **front_door_settings(args),
        )
    )
    return 0


def cmd_bench_http(args) -> int:
    from slora_vtc.cli.tenants import tenant_table
    from slora_vtc.server.bench import BenchConfig, run_bench

    result = run_bench(
        BenchConfig(
            args.trace_file,
            args.url,
            time_scale=args.time_scale,
            duration=args.duration,
            clients_file=args.clients,
            api=args.api,
            model=args.model,
            request_timeout_s=args.request_timeout,
            deadline_s=args.deadline,
            prompt_seed=args.prompt_seed,
        ),
        progress=True,
    )
    code = report([result], Path(args.out or f"results/http_{Path(args.trace_file).stem}.jsonl"))
    print(tenant_table(result))
    return code


def add_parsers(sub) -> None:
    srv = sub.add_parser(
        "serve", help="serve the real model over HTTP (OpenAI API, S-LoRA's /generate) with a fair scheduler"
    )
    add_model_args(srv, backend=True)
    add_adapter_args(srv)
    add_batching_args(srv)
    add_step_log_arg(srv)
    srv.add_argument(
        "--served-model-name",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="names the model answers to in requests (as vLLM's; repeatable); /v1/models lists them and responses "
        "say the first (default: the model's own name)",
    )
    srv.add_argument("--scheduler", default="vtc", help="scheduler spec, as for `run` (default: vtc)")
    add_front_door_args(
        srv, port=SERVER_PORT, clients_help="API keys, weights, RPM limits, LoRA adapters", queue="the scheduler"
    )
    srv.add_argument("--pool-tokens", type=int, default=10_000, help="memory pool size in tokens (default 10000)")
    srv.add_argument(
        "--tokenizer", help="tokenizer folder, or 'byte' (default: the model folder's tokenizer, else byte-level)"
    )
    srv.add_argument("--seed", type=int, default=0, help="seed of dummy weights and of sampling")
    srv.add_argument(
        "--max-client-labels",
        type=int,
        default=100,
        help='/metrics names the busiest N clients; the rest are client="other" (default 100)',
    )
    srv.add_argument(
        "--max-inflight",
        type=int,
        default=4096,
        help="generation requests handled at once; more get a 503 with Retry-After (default 4096)",
    )
    srv.add_argument(
        "--backlog", type=int, default=4096, help="listen backlog: connections not yet accepted (default 4096)"
    )
    srv.add_argument(
        "--prefix-cache", action="store_true", help="share the K/V of common prompt prefixes (a radix tree in the pool)"
    )
    srv.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the engine in a process of its own beside the HTTP server's, as vLLM does, so that the two stop"
        " taking turns on one GIL (the default); --no-engine-process: in a thread of the server's process",
    )
    srv.set_defaults(func=cmd_serve)

    bench = sub.add_parser("bench-http", help="replay a trace against a server over HTTP; writes a result file")
    bench.add_argument("trace_file", help="the trace to replay (JSONL / CSV / the paper's JSON / the artifact's .pkl)")
    bench.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    bench.add_argument("--out", help="result file (default: results/http_TRACE.jsonl)")
    bench.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="trace seconds per wall-clock second (e.g. 10: a 600 s trace in 60 s)",
    )
    bench.add_argument("--duration", type=float, help="replay only the requests sent before this trace time (s)")
    bench.add_argument("--clients", help="clients file: send each client's API key instead of X-Client-Id")
    bench.add_argument(
        "--api",
        default="slora",
        choices=["slora", "openai"],
        help="slora: S-LoRA's /generate_stream (the artifact's client; default); "
        "openai: streamed /v1/completions of any OpenAI-compatible server (vLLM, serve, gateway)",
    )
    bench.add_argument("--model", help="--api openai: the model to ask for (default: the first /v1/models lists)")
    bench.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="abort a request not finished after this many seconds (default 600)",
    )
    bench.add_argument(
        "--deadline",
        type=float,
        help="abort whatever is left after this many seconds of the run (default: last send + request timeout)",
    )
    bench.add_argument(
        "--prompt-seed",
        type=int,
        default=0,
        help="--api openai: which random prompts (default 0); runs with different seeds share no prompt, so that a "
        "server's prefix cache finds nothing of an earlier run's",
    )
    bench.set_defaults(func=cmd_bench_http)
