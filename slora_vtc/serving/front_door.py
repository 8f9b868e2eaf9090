"""The settings the server and the gateway share, with their defaults and checks, written once: where
they listen, who their clients are, and how they refuse, drain and forget (the HTTP front door both
put before a scheduler). ServerConfig and GatewayConfig extend it; cli/front_door.py's options read
their defaults from it."""

from dataclasses import dataclass

from slora_vtc.errors import UserError
from slora_vtc.serving.keepalive import KEEP_ALIVE_S

SERVER_PORT, GATEWAY_PORT = 8000, 8080  # where serve and gateway listen unless told


@dataclass(frozen=True)
class FrontDoor:
    clients_file: str | None = None  # API keys, weights, RPM limits (clients.py)
    host: str = "127.0.0.1"
    port: int = SERVER_PORT
    max_waiting: int = 2048  # beyond this many queued, a client over its even share of it gets a 503 with Retry-After
    max_body_bytes: int = 1 << 20  # larger request bodies get a 413 before they are parsed
    metrics_key: str | None = None  # when set, GET /metrics needs 'Authorization: Bearer KEY' (it names clients)
    client_idle_s: float = 600.0  # a client with nothing queued or running this long is forgotten (VTC lifts it)
    drain_s: float = 30.0  # on SIGINT / SIGTERM: let queued and running requests finish this long, then abort them
    keep_alive_s: float = KEEP_ALIVE_S  # an idle client connection is closed after this long

    def check(self) -> None:
        """One line naming the first bad setting (UserError)."""
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port must be in 0..65535, got {self.port}")
        for flag, value in (("--max-waiting", self.max_waiting), ("--max-body-bytes", self.max_body_bytes)):
            if value <= 0:
                raise UserError(f"{flag} must be positive, got {value}")
        if not 0 <= self.drain_s < float("inf"):
            raise UserError(f"--drain-timeout must be a non-negative number of seconds, got {self.drain_s}")
        for flag, value in (("--client-idle-timeout", self.client_idle_s), ("--keep-alive-timeout", self.keep_alive_s)):
            if not 0 < value < float("inf"):
                raise UserError(f"{flag} must be a positive number of seconds, got {value}")
        if self.metrics_key is not None and not self.metrics_key.strip():
            raise UserError("--metrics-key must not be empty")
