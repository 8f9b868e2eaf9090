"""Who a request is from, and what that client is entitled to: the clients file (TOML).

    [default]              # clients not listed below (optional)
    rpm = 60               # requests per minute; omit for no limit
    adapters = ["shared"]  # with API keys: adapters every client may name, besides its own

    [clients.alice]
    api_key = "sk-alice"   # once any client has a key, every request needs a known key
    weight = 2.0           # VTC weight (service share); needs a VTC-family scheduler
    rpm = 120
    adapter = "alice-lora" # LoRA adapter name (dummy weights derived from the name)
    adapters = ["alice-v2"] # with API keys: other adapters this client may name

Identity: with keys, the key's client (a header or `user` cannot override it); without keys,
the X-Client-Id header, else the OpenAI `user` field, else "anonymous".

Adapters: a request may name an adapter (`model` in the OpenAI API, `lora_dir` in /generate),
and only one the server serves (--lora, --dummy-adapters): never a path. With keys, a client may
name only its `adapter`, its `adapters` and those of [default]; any other is refused (403).
Without keys, identity is only what the client says, so any served adapter may be named.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from slora_vtc.errors import UserError
from slora_vtc.sched import RateLimited, Scheduler, build_scheduler
from slora_vtc.sched.registry import SchedulerOptions  # where ruff knows it as immutable (a default argument)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ANONYMOUS = "anonymous"
MAX_CLIENT_NAME = 256
CLIENT_KEYS = {"api_key", "weight", "rpm", "adapter", "adapters"}
DEFAULT_KEYS = {"rpm", "adapter", "adapters"}  # no default weight: VTC gives unlisted clients weight 1


class Unauthorized(Exception):
    """No API key, or one the clients file does not list."""


class BadClientName(ValueError):
    pass


@dataclass(frozen=True)
class ClientConfig:
    name: str
    api_key: str | None = None
    weight: float = 1.0
    rpm: int | None = None  # None: no limit
    adapter: str | None = None
    adapters: tuple[str, ...] = ()  # other adapters it may name (enforced with API keys)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return ((self.adapter,) if self.adapter else ()) + self.adapters


@dataclass(frozen=True)
class Clients:
    named: Mapping[str, ClientConfig] = field(default_factory=lambda: MappingProxyType({}))
    default: ClientConfig = ClientConfig("")

    def __reduce__(self):  # a read-only mapping does not pickle (serve's engine process gets the clients pickled)
        return _clients, (dict(self.named), self.default)

    @property
    def keys_required(self) -> bool:
        return any(c.api_key for c in self.named.values())

    def allowed_adapters(self, client: ClientConfig) -> tuple[str, ...] | None:
        """The adapters `client` may name; None: any the server serves (no API keys, so no identity to trust)."""
        if not self.keys_required:
            return None
        return tuple(dict.fromkeys(client.adapter_names + self.default.adapters))

    def by_key(self, api_key: str | None) -> ClientConfig:
        """The client an API key belongs to; Unauthorized if it is missing or unknown."""
        if not api_key:
            raise Unauthorized("missing API key: send 'Authorization: Bearer KEY'")
        for client in self.named.values():
            if client.api_key == api_key:
                return client
        raise Unauthorized("unknown API key")

    def identify(self, api_key: str | None, client_header: str | None, user: str | None) -> ClientConfig:
        if self.keys_required:
            return self.by_key(api_key)
        name = client_header or user or ANONYMOUS
        if len(name) > MAX_CLIENT_NAME:
            raise BadClientName(f"client id longer than {MAX_CLIENT_NAME} characters")
        return self.named.get(name) or replace(self.default, name=name)


def load_clients(path: str | Path | None) -> Clients:
    if path is None:
        return Clients()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: cannot read clients file ({e.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a valid TOML file ({e})") from None
    unknown = set(data) - {"default", "clients"}
    if unknown:
        raise UserError(f"{path}: unknown table '{sorted(unknown)[0]}' (expected [default] and [clients.NAME])")
    default = _client(path, "default", _table(path, "default", data.get("default", {})), DEFAULT_KEYS)
    named = {
        name: _client(path, f"clients.{name}", _table(path, f"clients.{name}", t), CLIENT_KEYS)
        for name, t in _table(path, "clients", data.get("clients", {})).items()
    }
    keys = [c.api_key for c in named.values() if c.api_key]
    if len(keys) != len(set(keys)):
        raise UserError(f"{path}: two clients share an api_key")
    return Clients(MappingProxyType(named), default)


def _table(path: Path, where: str, value) -> dict:
    if not isinstance(value, dict):
        raise UserError(f"{path}: [{where}] must be a table")
    return value


def _client(path: Path, where: str, table: dict, allowed: set[str]) -> ClientConfig:
    unknown = set(table) - allowed
    if unknown:
        raise UserError(
            f"{path}: [{where}] has unknown key '{sorted(unknown)[0]}' (allowed: {', '.join(sorted(allowed))})"
        )
    name = where.removeprefix("clients.")
    weight, rpm = table.get("weight", 1.0), table.get("rpm")
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < math.inf:  # NaN too
        raise UserError(f"{path}: [{where}] weight must be a positive, finite number, got {weight!r}")
    if rpm is not None and (isinstance(rpm, bool) or not isinstance(rpm, int) or rpm <= 0):
        raise UserError(f"{path}: [{where}] rpm must be a positive integer (omit it for no limit), got {rpm!r}")
    for key in ("api_key", "adapter"):
        if key in table and (not isinstance(table[key], str) or not table[key]):
            raise UserError(f"{path}: [{where}] {key} must be a non-empty string")
    adapters = table.get("adapters", [])
    if not isinstance(adapters, list) or not all(isinstance(a, str) and a for a in adapters):
        raise UserError(f"{path}: [{where}] adapters must be a list of adapter names, got {adapters!r}")
    return ClientConfig(name, table.get("api_key"), float(weight), rpm, table.get("adapter"), tuple(adapters))


def scheduler_for(spec: str, clients: Clients, options: SchedulerOptions = SchedulerOptions()) -> Scheduler:
    """The scheduler named by `spec`, with the clients' weights, behind their RPM limits if any."""
    scheduler = build_scheduler(spec, list(clients.named), options)
    weights = {c.name: c.weight for c in clients.named.values() if c.weight != 1.0}
    if weights:
        if not scheduler.traits.weights:
            raise UserError(f"client weights need a VTC scheduler (vtc, lcf, wvtc, vtc-...), not '{spec}'")
        for client, weight in weights.items():
            scheduler.set_weight(client, weight)
    limits = {c.name: c.rpm for c in clients.named.values() if c.rpm is not None}
    if limits or clients.default.rpm is not None:
        return RateLimited(scheduler, limits, clients.default.rpm)
    return scheduler


def _clients(named: dict[str, ClientConfig], default: ClientConfig) -> Clients:
    return Clients(MappingProxyType(named), default)
