"""The probe loop: brings upstreams that failed back when they answer again (and ends the waiting
requests when none does), adapts the budget of those that expose vLLM's queue metrics (adapt.py),
and forgets idle clients."""

import asyncio

import httpx2

from slora_vtc.gateway.adapt import Aimd, queue_metrics
from slora_vtc.gateway.context import GatewayContext
from slora_vtc.gateway.upstream import Upstream

DEFAULT_AIMD = Aimd()


async def monitor(ctx: GatewayContext, aimd: Aimd = DEFAULT_AIMD) -> None:
    while True:
        await asyncio.sleep(ctx.config.probe_interval_s)
        await asyncio.gather(*(probe(ctx, u, aimd) for u in ctx.pool.upstreams))
        ctx.fail_waiting_if_none_up()  # nothing came back: requests waiting for one end (503)
        ctx.dispatcher.expire(ctx.config.client_idle_s)
        ctx.dispatcher.pump()  # an upstream back, or a larger budget: room for waiting requests


async def probe(ctx: GatewayContext, upstream: Upstream, aimd: Aimd) -> None:
    try:
        if not upstream.up:
            upstream.up = (
                await ctx.http.get(f"{upstream.url}/health", timeout=ctx.config.connect_timeout_s)
            ).status_code == 200
        if upstream.adaptive and upstream.up:
            reply = await ctx.http.get(f"{upstream.url}/metrics", timeout=ctx.config.connect_timeout_s)
            queue = queue_metrics(reply.text) if reply.status_code == 200 else None
            if queue is not None:
                upstream.queued_upstream, upstream.batch = queue[0], max(upstream.batch, queue[1])
                upstream.limit = aimd.next_limit(upstream.limit, queue[0], upstream.inflight, upstream.batch)
    except httpx2.HTTPError:
        return  # still down (or its metrics did not answer this time): try again at the next probe
