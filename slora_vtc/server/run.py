"""`slora-vtc serve`: build the server and run it under uvicorn until SIGINT / SIGTERM.

On a signal the engine stops taking requests and serves the in-flight ones for up to the drain
timeout, then aborts the rest: every stream still ends with a final event. uvicorn waits for the
responses to complete (a little longer than the drain, then it cancels them, which also aborts
their requests), and the application's lifespan exit joins the engine thread.

A second signal cuts the drain short: everything left is aborted at once, so every stream gets
its final error event and every other request a 503, and the server exits as soon as those are
out (at most FLUSH_MARGIN_S later). A third one exits at once, as uvicorn does.
"""

import math
import signal
import sys
import threading
from pathlib import Path

import uvicorn

from slora_vtc.server.app import create_app
from slora_vtc.server.context import ServerConfig, ServerContext, build_context
from slora_vtc.serving.listen import listening_socket

FLUSH_MARGIN_S = 5  # after the drain: time for aborted streams to send their final events


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ctx: ServerContext):
        super().__init__(config)
        self.ctx = ctx
        self.stopped_by: int | None = None  # the signal that stopped the server
        self.signals = 0

    def handle_exit(self, sig, frame) -> None:
        self.signals += 1
        if self.signals == 1:
            self.stopped_by = sig
            self.ctx.service.stop(self.ctx.config.drain_s)
            super().handle_exit(sig, frame)
        elif self.signals == 2:
            self.ctx.service.stop(0.0)  # abort now; uvicorn's graceful wait ends once the final events are out
            timer = threading.Timer(FLUSH_MARGIN_S, self._force_exit)
            timer.daemon = True
            timer.start()
        else:
            self._force_exit()

    def _force_exit(self) -> None:
        self.force_exit = True  # uvicorn's wait loop reads it


def server_for(ctx: ServerContext, **overrides) -> Server:
    cfg = ctx.config
    settings = dict(
        host=cfg.host,
        port=cfg.port,
        log_level="info",
        lifespan="on",
        backlog=cfg.backlog,
        timeout_keep_alive=cfg.keep_alive_s,
        timeout_graceful_shutdown=math.ceil(cfg.drain_s) + FLUSH_MARGIN_S,
    )
    return Server(uvicorn.Config(create_app(ctx), **{**settings, **overrides}), ctx)


def backlog_note(backlog: int, somaxconn: Path = Path("/proc/sys/net/core/somaxconn")) -> str | None:
    """A warning when the kernel caps the listen backlog below --backlog. Beyond about twice the backlog of
    connections not yet accepted, Linux answers with SYN cookies that fail while the accept queue is full,
    and those clients get a reset their request never reached the server with."""
    try:
        cap = int(somaxconn.read_text())
    except (OSError, ValueError):
        return None
    if cap >= backlog:
        return None
    return (
        f"slora-vtc: warning: the kernel caps the listen backlog at {cap} (net.core.somaxconn), "
        f"below --backlog {backlog}; a burst of connections beyond that may be reset"
    )


def serve(config: ServerConfig) -> None:
    config.check()
    with listening_socket(config.host, config.port) as sock:  # before the model loads
        ctx = build_context(config)
        print(
            f"serving {ctx.model_name} with scheduler {config.scheduler} on http://{config.host}:{config.port} "
            f"(pool {config.pool_tokens} tokens)",
            flush=True,
        )
        note = backlog_note(config.backlog)
        if note:
            print(note, file=sys.stderr, flush=True)
        server = server_for(ctx)
        server.run(sockets=[sock])
    if server.stopped_by == signal.SIGINT:
        # uvicorn re-raises the signal after shutdown, but whether that surfaces as a
        # KeyboardInterrupt depends on where asyncio's own SIGINT handler catches it: be certain
        raise KeyboardInterrupt
