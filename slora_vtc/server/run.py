"""`slora-vtc serve`: build the server and run it under uvicorn until SIGINT / SIGTERM.

On a signal the engine stops taking requests and serves the in-flight ones for up to the drain
timeout, then aborts the rest: every stream still ends with a final event. uvicorn waits for the
responses to complete (a little longer than the drain, then it cancels them, which also aborts
their requests), and the application's lifespan exit joins the engine thread.
"""

import math
import signal

import uvicorn

from slora_vtc.server.app import create_app
from slora_vtc.server.context import ServerConfig, ServerContext, build_context

FLUSH_MARGIN_S = 5  # after the drain: time for aborted streams to send their final events


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ctx: ServerContext):
        super().__init__(config)
        self.ctx = ctx
        self.stopped_by: int | None = None  # the signal that stopped the server

    def handle_exit(self, sig, frame) -> None:
        self.stopped_by = sig
        self.ctx.service.stop(self.ctx.config.drain_s)
        super().handle_exit(sig, frame)


def server_for(ctx: ServerContext, **overrides) -> Server:
    settings = dict(host=ctx.config.host, port=ctx.config.port, log_level="info", lifespan="on",
                    timeout_graceful_shutdown=math.ceil(ctx.config.drain_s) + FLUSH_MARGIN_S)
    return Server(uvicorn.Config(create_app(ctx), **{**settings, **overrides}), ctx)


def serve(config: ServerConfig) -> None:
    ctx = build_context(config)
    print(f"serving {ctx.model_name} with scheduler {config.scheduler} on http://{config.host}:{config.port} "
          f"(pool {config.pool_tokens} tokens)", flush=True)
    server = server_for(ctx)
    server.run()
    if server.stopped_by == signal.SIGINT:
        # uvicorn re-raises the signal after shutdown, but whether that surfaces as a
        # KeyboardInterrupt depends on where asyncio's own SIGINT handler catches it: be certain
        raise KeyboardInterrupt
