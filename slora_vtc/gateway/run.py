"""`slora-vtc gateway`: check the upstreams, build the gateway, and run it under uvicorn."""

import math

import httpx2
import uvicorn

from slora_vtc.errors import UserError
from slora_vtc.gateway.adapt import Aimd, queue_metrics
from slora_vtc.gateway.app import create_app
from slora_vtc.gateway.config import DEFAULT_MAX_INFLIGHT, DEFERRED_MAX_INFLIGHT, GatewayConfig, upstream_base
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.dispatcher import Dispatcher
from slora_vtc.gateway.upstream import Upstream, UpstreamPool
from slora_vtc.sched import SchedulerOptions
from slora_vtc.serving.clients import load_clients, scheduler_for
from slora_vtc.serving.listen import listening_socket


def build_context(config: GatewayConfig, probe: bool = True) -> GatewayContext:
    """Everything the gateway needs; with `probe`, each upstream must answer /v1/models now."""
    config.check()
    clients = load_clients(config.clients_file)
    scheduler = scheduler_for(config.scheduler, clients)
    if scheduler.traits.needs_token_ids:
        raise UserError(
            f"scheduler '{config.scheduler}' needs prompt token ids and a prefix cache, which a gateway does not see: "
            "use one that needs only token counts (fcfs, rpm, vtc, lcf, wvtc, vtc-...)"
        )
    defers = scheduler.traits.defers  # the upstream schedules: no budget to adapt, every request goes on at once
    upstreams, models = [], []
    for url in config.upstreams:
        base = upstream_base(url)
        found, adaptive = _check_upstream(base, config, adapts=not defers) if probe else ([], False)
        models += [m for m in found if m not in models]
        default = DEFERRED_MAX_INFLIGHT if defers else DEFAULT_MAX_INFLIGHT
        limit = config.max_inflight or (Aimd().start if adaptive else default)
        upstreams.append(Upstream(base, limit, adaptive=adaptive))
    pool = UpstreamPool(upstreams)
    dispatcher = Dispatcher(scheduler, pool, SchedulerOptions().cost, config.max_waiting)
    return GatewayContext(config, clients, pool, dispatcher, models)


def _check_upstream(base: str, config: GatewayConfig, adapts: bool = True) -> tuple[list[str], bool]:
    """The models it serves, and whether its budget can be adapted (`adapts`, it exposes vLLM's
    queue metrics and no --max-inflight fixes it)."""
    headers = {"authorization": f"Bearer {config.upstream_api_key}"} if config.upstream_api_key else {}
    try:
        with httpx2.Client(timeout=config.connect_timeout_s, headers=headers) as http:
            reply = http.get(f"{base}/v1/models")
            if reply.status_code != 200:
                raise UserError(
                    f"--upstream {base}: /v1/models answered HTTP {reply.status_code}, not an OpenAI-compatible server?"
                )
            try:
                models = [card["id"] for card in reply.json()["data"]]
            except (ValueError, KeyError, TypeError):
                raise UserError(f"--upstream {base}: /v1/models did not answer an OpenAI model list") from None
            adaptive = False
            if adapts and config.max_inflight is None:
                page = http.get(f"{base}/metrics")
                adaptive = page.status_code == 200 and queue_metrics(page.text) is not None
    except httpx2.HTTPError as e:
        raise UserError(f"--upstream {base} does not answer ({type(e).__name__}: {e})") from None
    return models, adaptive


def server_for(ctx: GatewayContext, **overrides) -> uvicorn.Server:
    settings = dict(
        host=ctx.config.host,
        port=ctx.config.port,
        log_level=ctx.config.log_level,
        lifespan="on",
        timeout_graceful_shutdown=math.ceil(ctx.config.drain_s),
        timeout_keep_alive=ctx.config.keep_alive_s,
    )
    return uvicorn.Server(uvicorn.Config(create_app(ctx), **{**settings, **overrides}))


def run_gateway(config: GatewayConfig) -> None:
    ctx = build_context(config)
    sock = listening_socket(config.host, config.port)
    budgets = ", ".join(
        f"{u.url} ({'adaptive from ' + str(u.limit) if u.adaptive else u.limit} in flight)" for u in ctx.pool.upstreams
    )
    print(
        f"gateway with scheduler {config.scheduler} on http://{config.host}:{config.port} in front of {budgets}",
        flush=True,
    )
    server_for(ctx).run(sockets=[sock])
