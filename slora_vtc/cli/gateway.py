"""`gateway`: a fair OpenAI-compatible proxy in front of one or more upstream servers (docs/gateway.md)."""

from slora_vtc.cli.front_door import add_front_door_args, front_door_settings
from slora_vtc.serving.front_door import GATEWAY_PORT


def cmd_gateway(args) -> int:
    from slora_vtc.gateway.config import GatewayConfig
    from slora_vtc.gateway.run import run_gateway

    run_gateway(
        GatewayConfig(
            upstreams=tuple(args.upstream),
            scheduler=args.scheduler,
            max_inflight=args.max_inflight,
            connect_timeout_s=args.connect_timeout,
            upstream_timeout_s=args.upstream_timeout,
            upstream_api_key=args.upstream_api_key,
            probe_interval_s=args.probe_interval,
            log_level=args.log_level,
            **front_door_settings(args),
        )
    )
    return 0


def add_parsers(sub) -> None:
    gw = sub.add_parser(
        "gateway", help="a fair OpenAI-compatible proxy in front of vLLM, `serve` or any OpenAI-compatible servers"
    )
    gw.add_argument(
        "--upstream",
        action="append",
        required=True,
        metavar="URL",
        help="an upstream server's root URL, e.g. http://10.0.0.5:8000 (repeatable)",
    )
    gw.add_argument(
        "--scheduler",
        default="vtc",
        help="scheduler spec needing only token counts: fcfs, rpm:N, vtc, lcf, wvtc:..., vtc-... (default: vtc)",
    )
    add_front_door_args(
        gw, port=GATEWAY_PORT, clients_help="API keys, weights, RPM limits, as for serve", queue="the gateway"
    )
    gw.add_argument(
        "--max-inflight",
        type=int,
        help="requests in flight per upstream, fixed "
        "(default: adapted from vLLM's queue metrics where the upstream exposes them, else 64)",
    )
    gw.add_argument("--connect-timeout", type=float, default=5.0, help="seconds to connect to an upstream (default 5)")
    gw.add_argument(
        "--upstream-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for an upstream's next byte before a 504 (default 300)",
    )
    gw.add_argument(
        "--upstream-api-key", help="send 'Authorization: Bearer KEY' to the upstreams (e.g. vLLM's --api-key)"
    )
    gw.add_argument(
        "--probe-interval",
        type=float,
        default=0.5,
        help="seconds between probes of the upstreams' health and queue metrics (default 0.5)",
    )
    gw.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="uvicorn's log level; warning and above drop the access log (default info)",
    )
    gw.set_defaults(func=cmd_gateway)
