"""The options `serve` and `gateway` share: where they listen, who their clients are, and how they
refuse, drain and forget (the HTTP front door both put before a scheduler)."""

from slora_vtc.serving.keepalive import KEEP_ALIVE_HELP, KEEP_ALIVE_S


def add_front_door_args(parser, port: int, clients_help: str, queue: str) -> None:
    """`queue`: where requests wait before they run (the scheduler's queue, or the gateway's)."""
    parser.add_argument("--clients", help=f"clients file (TOML): {clients_help}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=2048,
        help=f"requests queued in {queue}; beyond, a client holding its even share of it gets a 503 "
        "with Retry-After, and everyone at twice this (default 2048)",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get a 413 (default 1 MiB)"
    )
    parser.add_argument(
        "--metrics-key", help="GET /metrics needs 'Authorization: Bearer KEY' (it exposes client names)"
    )
    parser.add_argument(
        "--client-idle-timeout",
        type=float,
        default=600.0,
        help="forget a client idle this many seconds (default 600; VTC lifts it on return)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGINT/SIGTERM, seconds to let requests (queued and running) finish before aborting them (default 30)",
    )
    parser.add_argument("--keep-alive-timeout", type=float, default=KEEP_ALIVE_S, help=KEEP_ALIVE_HELP)
