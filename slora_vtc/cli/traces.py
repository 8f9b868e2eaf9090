"""`trace build`: Chatbot Arena (or ShareGPT) conversation logs -> a trace file."""


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


def add_parsers(sub) -> None:
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
