"""The gateway's settings, checked once: one line naming what is wrong (UserError)."""

from dataclasses import dataclass

import httpx2

from slora_vtc.errors import UserError
from slora_vtc.serving.keepalive import KEEP_ALIVE_S

DEFAULT_MAX_INFLIGHT = 64  # per upstream, when it does not expose vLLM's queue metrics and no --max-inflight is given
# per upstream under a scheduler that defers to the upstream's (passthrough): only a bound against a runaway client
DEFERRED_MAX_INFLIGHT = 4096


def upstream_base(url: str) -> str:
    """The upstream's root URL (paths such as /v1/completions are added to it): a trailing /v1 is dropped."""
    try:
        parsed = httpx2.URL(url)
    except Exception:  # httpx2 raises several kinds for malformed URLs
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UserError(f"--upstream '{url}' is not an http:// or https:// URL")
    return url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class GatewayConfig:
    upstreams: tuple[str, ...]
    scheduler: str = "vtc"
    clients_file: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    max_inflight: int | None = None  # fixed per upstream; None: adapted from vLLM's queue metrics where exposed
    max_waiting: int = (
        2048  # beyond this many queued, a client over its even share of it gets a 503 (sched/shedding.py)
    )
    connect_timeout_s: float = 5.0
    upstream_timeout_s: float = 300.0  # the longest wait for the upstream's next byte
    upstream_api_key: str | None = None  # sent to every upstream as 'Authorization: Bearer KEY'
    max_body_bytes: int = 1 << 20
    probe_interval_s: float = 0.5  # how often the upstreams' health and queue metrics are read
    log_level: str = "info"  # uvicorn's; "warning" drops the access log
    metrics_key: str | None = None  # when set, GET /metrics needs 'Authorization: Bearer KEY' (it names clients)
    client_idle_s: float = (
        600.0  # a client with nothing waiting or in flight this long is forgotten (VTC lifts it on return)
    )
    drain_s: float = 30.0  # on SIGINT / SIGTERM: let in-flight and queued requests finish this long, then cancel them
    keep_alive_s: float = KEEP_ALIVE_S  # an idle client connection is closed after this long

    def check(self) -> None:
        if not self.upstreams:
            raise UserError("give at least one --upstream URL")
        for url in self.upstreams:
            upstream_base(url)
        if len(set(map(upstream_base, self.upstreams))) != len(self.upstreams):
            raise UserError("the same --upstream is given twice")
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port must be in 0..65535, got {self.port}")
        for flag, value in (
            ("--max-inflight", self.max_inflight),
            ("--max-waiting", self.max_waiting),
            ("--max-body-bytes", self.max_body_bytes),
        ):
            if value is not None and value <= 0:
                raise UserError(f"{flag} must be positive, got {value}")
        if not 0 <= self.drain_s < float("inf"):
            raise UserError(f"--drain-timeout must be a non-negative number of seconds, got {self.drain_s}")
        for flag, value in (
            ("--connect-timeout", self.connect_timeout_s),
            ("--upstream-timeout", self.upstream_timeout_s),
            ("--probe-interval", self.probe_interval_s),
            ("--client-idle-timeout", self.client_idle_s),
            ("--keep-alive-timeout", self.keep_alive_s),
        ):
            if not 0 < value < float("inf"):
                raise UserError(f"{flag} must be a positive number of seconds, got {value}")
