"""What a running gateway is made of: its settings, clients, upstreams, dispatcher and HTTP client."""

from dataclasses import dataclass, field

import httpx2

from slora_vtc.gateway.config import GatewayConfig
from slora_vtc.gateway.dispatcher import Busy, Dispatcher
from slora_vtc.gateway.upstream import Upstream, UpstreamPool
from slora_vtc.serving.clients import Clients


@dataclass(eq=False)
class GatewayContext:
    config: GatewayConfig
    clients: Clients
    pool: UpstreamPool
    dispatcher: Dispatcher
    models: list[str] = field(default_factory=list)  # the upstreams' model ids, at start
    http: httpx2.AsyncClient | None = None  # made on the event loop, in the application's lifespan

    def mark_down(self, upstream: Upstream, certain: bool = True) -> None:
        """The upstream failed a connection: send it nothing until a probe answers. Where that is
        `certain` (nothing listens) and no upstream is left, the waiting requests end now (503)
        rather than wait for one; a connect that only timed out may be a moment's overload, so they
        wait for the next probe's verdict (`fail_waiting_if_none_up`, after every probe round)."""
        upstream.up = False
        if certain:
            self.fail_waiting_if_none_up()

    def fail_waiting_if_none_up(self) -> None:
        if not self.pool.any_up:
            self.dispatcher.fail_waiting(Busy(503, "no upstream is available", "server_error", "upstream_unavailable"))

    def upstream_headers(self, authorization: str | None, client: str) -> dict[str, str]:
        headers = {"content-type": "application/json", "x-client-id": client}
        if self.config.upstream_api_key:
            headers["authorization"] = f"Bearer {self.config.upstream_api_key}"
        elif authorization and not self.clients.keys_required:
            headers["authorization"] = authorization  # a key meant for the upstreams: passed on
        return headers
