"""`trace build`: Chatbot Arena, lmsys-chat-1m or ShareGPT conversation logs -> a trace file."""


def cmd_trace_build(args) -> int:
    from slora_vtc.errors import UserError
    from slora_vtc.traces import write_trace
    from slora_vtc.traces.build import build_trace
    from slora_vtc.traces.multi_turn import DEFAULT_THINK_TIME_S
    from slora_vtc.traces.readers import check_trace_out
    from slora_vtc.traces.tokenize import token_counter

    if args.think_time is None:
        args.think_time = DEFAULT_THINK_TIME_S
    elif not args.multi_turn:
        raise UserError("--think-time applies only with --multi-turn (single-turn chats have no later turns)")
    check_trace_out(args.out)  # before the build: a name replay would misread
    count, bos = token_counter(args.tokenizer)
    records, stats = build_trace(
        args.raw_file,
        args.rate,
        args.duration,
        count,
        bos,
        args.seed,
        args.arrivals,
        args.client_field,
        args.multi_turn,
        args.think_time,
        progress=True,
    )
    write_trace(records, args.out)
    print(multi_turn_line(stats, args) if args.multi_turn else summary_line(stats, args))
    print(arrivals_line(stats, args))
    return 0


def multi_turn_line(stats, args) -> str:
    sampled = (
        f"{stats.sampled} turns of {stats.sampled_conversations} conversations from {stats.clients} clients, "
        f"first turns over {args.duration:g} s, later ones {args.think_time:g} s apart"
    )
    if stats.sampled < stats.wanted:
        sampled = (
            f"asked for {stats.wanted} (rate {args.rate:g} x duration {args.duration:g} s), "
            f"only {stats.sampled} qualify: {sampled}"
        )
    return (
        f"{stats.records} records, {stats.conversations} conversations with {stats.turns} turns, "
        f"{stats.too_long} turns dropped (a length of 0 or >= 1024), {sampled} -> {args.out}"
    )


def summary_line(stats, args) -> str:
    sampled = f"{stats.sampled} requests from {stats.clients} clients sampled over {args.duration:g} s"
    if stats.sampled < stats.wanted:
        sampled = (
            f"asked for {stats.wanted} (rate {args.rate:g} x duration {args.duration:g} s), "
            f"only {stats.sampled} qualify: {sampled}"
        )
    return (
        f"{stats.records} records, {stats.single_turn} single-turn chats, "
        f"{stats.too_long} dropped (a length of 0 or >= 1024), {sampled} -> {args.out}"
    )


def arrivals_line(stats, args) -> str:
    if stats.arrivals == "timestamps":
        return f"arrivals: timestamps (each record's time, mapped linearly onto [0, {args.duration:g}] s)"
    why = "--arrivals poisson" if args.arrivals == "poisson" else "the records have no timestamps"
    starts = f"{stats.sampled_conversations} first turns at" if args.multi_turn else f"{stats.sampled}"
    return (
        f"arrivals: poisson ({why}): {starts} uniform times on [0, {args.duration:g}] s, sorted, "
        f"in record order (seed {args.seed})"
    )


def add_parsers(sub) -> None:
    trace = sub.add_parser(
        "trace", help="build a trace from Chatbot Arena, lmsys-chat-1m or ShareGPT conversation logs"
    )
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    build = trace_sub.add_parser(
        "build",
        help="raw logs (JSON, JSONL or parquet, optionally .gz) -> trace (JSONL, or CSV / parquet by extension)",
    )
    build.add_argument("raw_file")
    build.add_argument("--rate", type=float, required=True, help="requests per second to sample")
    build.add_argument("--duration", type=float, required=True, help="seconds the sampled requests are spread over")
    build.add_argument(
        "--out",
        required=True,
        help="the trace: .csv, .parquet, or JSONL for any other name (not .json / .pkl); add .gz to gzip it",
    )
    build.add_argument("--tokenizer", help="local Hugging Face tokenizer folder (default: an approximate count)")
    build.add_argument("--seed", type=int, default=42)
    build.add_argument(
        "--arrivals",
        choices=("auto", "timestamps", "poisson"),
        default="auto",
        help="timestamps: the records' times rescaled onto the duration; poisson: seeded uniform times "
        "(for data without timestamps); auto (default): timestamps when every record has one, else poisson",
    )
    build.add_argument(
        "--client-field",
        metavar="FIELD",
        help="the record field naming each request's client (default: the model; 'sharegpt' / 'messages' "
        "for ShareGPT / OpenAI-style records without one)",
    )
    build.add_argument(
        "--multi-turn",
        action="store_true",
        help="keep multi-turn conversations: each turn is a request whose prompt is the history plus the new message "
        "(named segments); rate x duration counts turns",
    )
    build.add_argument(
        "--think-time",
        type=float,
        metavar="SECONDS",
        help="--multi-turn: seconds between a conversation's turns (default 10)",
    )
    build.set_defaults(func=cmd_trace_build)
