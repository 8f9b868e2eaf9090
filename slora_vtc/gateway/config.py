"""The gateway's settings, checked once: one line naming what is wrong (UserError)."""

from dataclasses import dataclass

import httpx2

from slora_vtc.errors import UserError
from slora_vtc.serving.front_door import GATEWAY_PORT, FrontDoor

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


@dataclass(frozen=True, kw_only=True)
class GatewayConfig(FrontDoor):
    """`gateway`'s settings: the front door's (serving/front_door.py) and its upstreams'."""

    upstreams: tuple[str, ...]
    scheduler: str = "vtc"
    port: int = GATEWAY_PORT
    max_inflight: int | None = None  # fixed per upstream; None: adapted from vLLM's queue metrics where exposed
    connect_timeout_s: float = 5.0
    upstream_timeout_s: float = 300.0  # the longest wait for the upstream's next byte
    upstream_api_key: str | None = None  # sent to every upstream as 'Authorization: Bearer KEY'
    probe_interval_s: float = 0.5  # how often the upstreams' health and queue metrics are read
    log_level: str = "info"  # uvicorn's; "warning" drops the access log

    def check(self) -> None:
        if not self.upstreams:
            raise UserError("give at least one --upstream URL")
        for url in self.upstreams:
            upstream_base(url)
        if len(set(map(upstream_base, self.upstreams))) != len(self.upstreams):
            raise UserError("the same --upstream is given twice")
        super().check()
        if self.max_inflight is not None and self.max_inflight <= 0:
            raise UserError(f"--max-inflight must be positive, got {self.max_inflight}")
        for flag, value in (
            ("--connect-timeout", self.connect_timeout_s),
            ("--upstream-timeout", self.upstream_timeout_s),
            ("--probe-interval", self.probe_interval_s),
        ):
            if not 0 < value < float("inf"):
                raise UserError(f"{flag} must be a positive number of seconds, got {value}")
