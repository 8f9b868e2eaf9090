"""The options `serve` and `gateway` share: where they listen, who their clients are, and how they
refuse, drain and forget (the HTTP front door both put before a scheduler). Their defaults are
serving/front_door.py's, which ServerConfig and GatewayConfig extend."""

from slora_vtc.serving.front_door import FrontDoor
from slora_vtc.serving.keepalive import KEEP_ALIVE_HELP


def add_front_door_args(parser, port: int, clients_help: str, queue: str) -> None:
    """`queue`: where requests wait before they run (the scheduler's queue, or the gateway's)."""
    parser.add_argument("--clients", help=f"clients file (TOML): {clients_help}")
    parser.add_argument("--host", default=FrontDoor.host, help=f"address to listen on (default {FrontDoor.host})")
    parser.add_argument("--port", type=int, default=port, help=f"port to listen on (default {port})")
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=FrontDoor.max_waiting,
        help=f"requests queued in {queue}; beyond, a client holding its even share of it gets a 503 "
        f"with Retry-After, and everyone at twice this (default {FrontDoor.max_waiting})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=FrontDoor.max_body_bytes,
        help=f"larger request bodies get a 413 (default {FrontDoor.max_body_bytes:,} bytes)",
    )
    parser.add_argument(
        "--metrics-key", help="GET /metrics needs 'Authorization: Bearer KEY' (it exposes client names)"
    )
    parser.add_argument(
        "--client-idle-timeout",
        type=float,
        default=FrontDoor.client_idle_s,
        help=f"forget a client idle this many seconds (default {FrontDoor.client_idle_s:g}; VTC lifts it on return)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=FrontDoor.drain_s,
        help="on SIGINT/SIGTERM, seconds to let requests (queued and running) finish before aborting them "
        f"(default {FrontDoor.drain_s:g})",
    )
    parser.add_argument("--keep-alive-timeout", type=float, default=FrontDoor.keep_alive_s, help=KEEP_ALIVE_HELP)


def front_door_settings(args) -> dict:
    """The shared options' values, as ServerConfig's and GatewayConfig's fields."""
    return {
        "clients_file": args.clients,
        "host": args.host,
        "port": args.port,
        "max_waiting": args.max_waiting,
        "max_body_bytes": args.max_body_bytes,
        "metrics_key": args.metrics_key,
        "client_idle_s": args.client_idle_timeout,
        "drain_s": args.drain_timeout,
        "keep_alive_s": args.keep_alive_timeout,
    }
