"""The plugin's settings: the "slora_vtc" object of vLLM's `--additional-config`, and the scheduler
they name.

    --additional-config '{"slora_vtc": {"scheduler": "vtc", "clients": "clients.toml"}}'

scheduler       a spec as `slora-vtc serve --scheduler` takes: fcfs, vtc, lcf, wvtc:W1,W2,... (one weight
                per client of the clients file, in order), rpm:LIMIT, dlpm:Q, ... (default vtc)
clients         the clients file `serve` reads (weights, RPM limits; API keys for the middleware)
charge_cached   VTC's weight of a prompt token the prefix cache held, in [0, 1] (default 1: the paper's)
log_interval_s  seconds between two log lines of counters, waiting and running per tenant (default 10)
stats_file      where the same numbers are written as JSON (default: nowhere)
lift            VTC's counter lift: paper (default), artifact, none, or running (a tenant with a request
                running keeps up to one request's credit when its queue refills: slora_vtc/sched/vtc.py,
                docs/vllm.md)
step_log        where one JSON line per engine step is written (slora_vtc/vllm/steps.py; default: nowhere)

Anything else (an unknown key, a value of the wrong type, an unknown scheduler, a clients file that
cannot be read) is a UserError whose message is one line naming it.
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields

from slora_vtc.errors import UserError
from slora_vtc.sched import Scheduler
from slora_vtc.sched.registry import SchedulerOptions
from slora_vtc.sched.vtc import Lift
from slora_vtc.serving.clients import Clients, load_clients, scheduler_for

SECTION = "slora_vtc"
LIFTS = tuple(lift.value for lift in Lift)


@dataclass(frozen=True)
class PluginConfig:
    scheduler: str = "vtc"
    clients: str | None = None
    charge_cached: float = 1.0
    log_interval_s: float = 10.0
    stats_file: str | None = None
    lift: str = "paper"
    step_log: str | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("charge_cached", "log_interval_s"):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise UserError(f"{SECTION}.{f.name} must be a number, got {value!r}")
            elif not (value is None and f.default is None) and not isinstance(value, str):
                raise UserError(f"{SECTION}.{f.name} must be a string, got {value!r}")
        if not self.log_interval_s > 0:
            raise UserError(f"{SECTION}.log_interval_s must be positive, got {self.log_interval_s}")
        if not 0 <= self.charge_cached <= 1:
            raise UserError(f"{SECTION}.charge_cached must be in [0, 1], got {self.charge_cached}")
        if self.lift not in LIFTS:
            raise UserError(f"{SECTION}.lift must be one of {', '.join(LIFTS)}, got {self.lift!r}")

    @classmethod
    def of(cls, additional_config: Mapping | None) -> "PluginConfig":
        """The settings in vLLM's additional config (all defaults when it has no "slora_vtc")."""
        section = (additional_config or {}).get(SECTION, {})
        if not isinstance(section, Mapping):
            raise UserError(f"additional config '{SECTION}' must be an object, got {section!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise UserError(
                f"additional config '{SECTION}' has unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})"
            )
        return cls(**section)

    def load_clients(self) -> Clients:
        return load_clients(self.clients)

    def build_scheduler(self, clients: Clients) -> Scheduler:
        """The scheduler named, with the clients' weights and RPM limits, checked to run inside vLLM."""
        options = SchedulerOptions(charge_cached=self.charge_cached, lift=Lift(self.lift))
        scheduler = scheduler_for(self.scheduler, clients, options)
        if not scheduler.traits.preemption:
            raise UserError(
                f"scheduler '{self.scheduler}' cannot run inside vLLM: it does not take requests back "
                "(vLLM preempts, and puts back requests it cannot start yet)"
            )
        return scheduler
