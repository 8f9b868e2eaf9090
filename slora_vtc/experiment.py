"""What one experiment is: a suite's workload served by one scheduler on one backend. A description
only, in five frozen parts; slora_vtc/runner.py runs it.

- `WorkloadSetup`: which requests arrive when (suite, trace, duration, seed, jitter, load scale, the
  tokens the serving path adds) and when the run stops (`horizon`).
- `SchedulingSetup`: the scheduler spec and how it charges (cost function, lift rule, VTC's charging
  options).
- `MemorySetup`: the token pool, the prefix cache, the admission rule, the dummy LoRA adapters
  that take pool slots, and the batching (S-LoRA's loop, or vLLM's chunked prefill with its budget,
  sequence cap and block size).
- `BackendSetup`: what computes the steps (simulator or real model) and its settings.
- `ClusterSetup`: several replicas behind routers (the simulator only).

`horizon` belongs to the workload: like `duration` it is a time window of the run, the same whatever
scheduler, memory or backend serves it (the figures cut prefix runs at the suite's duration).
`profile` belongs to the backend: it is a measurement of the hardware, which the simulator is fitted
to; the profiled cost (`cost = "profile"`) prices service by that same measurement, so the
scheduler reads it from the backend's part rather than holding a copy.

Sweep grids, result files and the CLI name settings by flat keys (`pool_tokens`, `router_sync`).
`KEYS` maps each to its part and field, in the order result files write them, and says which runs
record it: the one place that decides what a result file's config holds. `Experiment.of(**flat)`
builds an experiment, `exp.replace(**flat)` changes some settings, `exp.flat()` gives them all.
"""

import dataclasses
import typing
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

from slora_vtc.backends.registry import BackendSettings, get_backend
from slora_vtc.backends.sim import DEFAULT_TESTBED
from slora_vtc.config import EngineConfig
from slora_vtc.cost import CostFunction, LinearCost, ProfiledCost
from slora_vtc.errors import UserError
from slora_vtc.model.adapters import DUMMY_PREFIX, AdapterTable, adapter_table
from slora_vtc.model.spec import resolve_spec
from slora_vtc.profile import load_profile
from slora_vtc.request import Request
from slora_vtc.sched import Lift, SchedulerOptions
from slora_vtc.suites import get_suite
from slora_vtc.workload import Workload

COSTS = ("linear", "profile")


@dataclass(frozen=True, kw_only=True)
class WorkloadSetup:
    suite: str
    duration: float | None = None  # seconds of arrivals (default: the suite's)
    seed: int = 42  # seeds the workload, the jitter, randomised schedulers and routers
    trace: str | None = None  # a trace file for a trace suite (default: the paper's LMSYS trace)
    jitter_ms: float = 0.0  # each arrival comes up to this much later (uniform, seeded by `seed`): for ensembles
    load_scale: int = 1  # every request sent this many times (a cluster of N replicas at one engine's load: N)
    added_tokens: int = 1  # tokens the serving path adds to each prompt: the artifact's server prepends a BOS
    horizon: float | None = None  # stop at this time, aborting what has not finished (default: serve every request)

    def build(self) -> Workload:
        return get_suite(self.suite).workload(self.duration, self.seed, self.trace).scaled(self.load_scale)


@dataclass(frozen=True, kw_only=True)
class SchedulingSetup:
    scheduler: str  # a scheduler spec (slora_vtc.sched.SCHEDULERS)
    cost: str = "linear"  # the service cost: linear, or profile (fitted to the backend's profile)
    lift: str = "paper"  # VTC's counter lift rule (slora_vtc.sched.Lift)
    extra_charge_at_finish: bool = False  # the artifact's extra decode charge when a request finishes
    charge_cached: float = 1.0  # VTC: weight of a cached prompt token (1: the paper's VTC; 0: extend tokens only)
    charge_recompute: bool = False  # VTC: charge again the tokens a preempted request recomputes


@dataclass(frozen=True, kw_only=True)
class MemorySetup:
    pool_tokens: int | None = None  # default: the suite's
    prefix_cache: bool = False  # share K/V of common prompt prefixes (a radix tree in the pool)
    admission: str = "conservative"  # or optimistic: admit while slots are free, preempt by recompute
    adapters: int | None = None  # dummy LoRA adapters the clients map to, round robin (default: one per client
    # on the simulator, none on a real backend; 0: none)
    adapter_rank: int = 8  # rank of the dummy adapters
    batching: str = "slora"  # or chunked: vLLM's step rule, prompts prefilled in chunks within a token budget
    max_num_batched_tokens: int = 2048  # chunked: tokens one step computes
    max_num_seqs: int = 256  # chunked: requests running at once
    block_size: int = 16  # chunked: tokens per KV block


@dataclass(frozen=True, kw_only=True)
class BackendSetup:
    name: str = "sim"  # a backend (slora_vtc.backends.BACKENDS)
    testbed: str = DEFAULT_TESTBED  # the simulator's testbed (slora_vtc.backends.sim.TESTBEDS), or a testbed file
    profile: str | None = None  # a cost-profile file to calibrate the simulator (and the profiled cost) with
    model: str | None = None  # real backends: a ModelSpec name or a Hugging Face folder (default: the backend's)
    lora: tuple[str, ...] = ()  # real backends: PEFT adapters as NAME=PATH; the clients map to these (then the dummies)
    time_scale: float = 1.0  # real backends: workload seconds per wall-clock second
    device: str | None = None  # real backends (default: cpu for torch, cuda for triton)
    dtype: str | None = None  # real backends (default: float32 on a CPU, float16 on a GPU)

    @property
    def real(self) -> bool:
        """Whether it runs a model (torch, triton) rather than simulating one."""
        return get_backend(self.name).runs_model

    @property
    def model_name(self) -> str | None:
        return (self.model or get_backend(self.name).default_model) if self.real else None


@dataclass(frozen=True, kw_only=True)
class ClusterSetup:
    replicas: int = 1  # engines behind a router (1: one engine)
    router: str = "round-robin"  # a router spec (slora_vtc.cluster.ROUTERS)
    routers: int = 1  # global-vtc: router instances, each with its own counters
    router_sync: float | None = None  # their counters become cluster-wide every S s (None: never)
    ingress_skew: float = 0.0  # share of a client's requests entering by its home router (the rest go round robin)
    pool_tokens: tuple[int, ...] = ()  # pool of replica i: entry i mod len (default: the memory's pool for all)
    testbeds: tuple[str, ...] = ()  # testbed of replica i: entry i mod len (default: the backend's for all)

    @property
    def clustered(self) -> bool:
        """Whether the run goes through the cluster loop (several replicas, or several routers)."""
        return self.replicas > 1 or self.routers > 1


class Recorded(Enum):
    """Which runs write a setting into their result file's config."""

    ALWAYS = "always"
    SIM = "runs on the simulator"
    REAL = "runs on a real backend"
    CLUSTER = "cluster runs"
    CHUNKED = "runs under chunked batching"


@dataclass(frozen=True)
class Key:
    """Where a flat key lives: a part of Experiment and a field of that part."""

    part: str
    field: str
    recorded: Recorded = Recorded.ALWAYS


# Every flat key, in the order result files write them.
KEYS: dict[str, Key] = {
    "suite": Key("workload", "suite"),
    "scheduler": Key("scheduling", "scheduler"),
    "pool_tokens": Key("memory", "pool_tokens"),
    "duration": Key("workload", "duration"),
    "seed": Key("workload", "seed"),
    "cost": Key("scheduling", "cost"),
    "lift": Key("scheduling", "lift"),
    "extra_charge_at_finish": Key("scheduling", "extra_charge_at_finish"),
    "profile": Key("backend", "profile"),
    "testbed": Key("backend", "testbed", Recorded.SIM),
    "added_tokens": Key("workload", "added_tokens"),
    "jitter_ms": Key("workload", "jitter_ms"),
    "load_scale": Key("workload", "load_scale"),
    "backend": Key("backend", "name"),
    "prefix_cache": Key("memory", "prefix_cache"),
    "admission": Key("memory", "admission"),
    "charge_cached": Key("scheduling", "charge_cached"),
    "charge_recompute": Key("scheduling", "charge_recompute"),
    "horizon": Key("workload", "horizon"),
    "trace": Key("workload", "trace"),
    "model": Key("backend", "model", Recorded.REAL),
    "adapters": Key("memory", "adapters"),
    "adapter_rank": Key("memory", "adapter_rank"),
    "lora": Key("backend", "lora"),
    "time_scale": Key("backend", "time_scale", Recorded.REAL),
    "device": Key("backend", "device", Recorded.REAL),
    "dtype": Key("backend", "dtype", Recorded.REAL),
    "replicas": Key("cluster", "replicas", Recorded.CLUSTER),
    "router": Key("cluster", "router", Recorded.CLUSTER),
    "routers": Key("cluster", "routers", Recorded.CLUSTER),
    "router_sync": Key("cluster", "router_sync", Recorded.CLUSTER),
    "ingress_skew": Key("cluster", "ingress_skew", Recorded.CLUSTER),
    "replica_pool_tokens": Key("cluster", "pool_tokens", Recorded.CLUSTER),
    "replica_testbeds": Key("cluster", "testbeds", Recorded.CLUSTER),
    "batching": Key("memory", "batching", Recorded.CHUNKED),
    "max_num_batched_tokens": Key("memory", "max_num_batched_tokens", Recorded.CHUNKED),
    "max_num_seqs": Key("memory", "max_num_seqs", Recorded.CHUNKED),
    "block_size": Key("memory", "block_size", Recorded.CHUNKED),
}


def keys_of(part: str) -> tuple[str, ...]:
    """The flat keys of one part, in KEYS's order (`keys_of("cluster")`: a grid file's [cluster] table)."""
    return tuple(name for name, key in KEYS.items() if key.part == part)


def default_settings() -> dict[str, object]:
    """Each flat key that has a default, with it (the others, suite and scheduler, every run must give)."""
    defaults = {}
    for name, key in KEYS.items():
        field = _field(key)
        if field.default is not dataclasses.MISSING:
            defaults[name] = field.default
    return defaults


def setting_type(name: str):
    """The type of a flat key's value (`int | None` for pool_tokens)."""
    key = KEYS[name]
    return typing.get_type_hints(PARTS[key.part])[key.field]


@dataclass(frozen=True)
class Experiment:
    """One run's description, in five parts (see the module's docstring); equal settings, equal experiments."""

    workload: WorkloadSetup
    scheduling: SchedulingSetup
    memory: MemorySetup = MemorySetup()
    backend: BackendSetup = BackendSetup()
    cluster: ClusterSetup = ClusterSetup()

    # -- flat keys ------------------------------------------------------------------------------
    @classmethod
    def of(cls, **settings) -> "Experiment":
        """An experiment from flat keys: `Experiment.of(suite="overload", scheduler="vtc", pool_tokens=20_000)`."""
        given = _by_part(settings)
        return cls(**{part: setup(**given.get(part, {})) for part, setup in PARTS.items()})

    def replace(self, **settings) -> "Experiment":
        """This experiment with some flat keys changed."""
        parts = {
            part: dataclasses.replace(getattr(self, part), **fields) for part, fields in _by_part(settings).items()
        }
        return dataclasses.replace(self, **parts)

    def flat(self) -> dict[str, object]:
        """Every setting by its flat key, in KEYS's order."""
        return {name: getattr(getattr(self, key.part), key.field) for name, key in KEYS.items()}

    def result_config(self, pool_tokens: int, duration: float) -> dict:
        """What a result file records of this run: the settings this kind of run uses, with the pool,
        the duration and the model the run resolved (the suite's, the backend's defaults)."""
        settings = {**self.flat(), "model": self.backend.model_name, "pool_tokens": pool_tokens, "duration": duration}
        kept = {Recorded.ALWAYS, Recorded.REAL if self.backend.real else Recorded.SIM}
        if self.cluster.clustered:
            kept.add(Recorded.CLUSTER)
        if self.memory.batching != "slora":
            kept.add(Recorded.CHUNKED)
        return {name: value for name, value in settings.items() if KEYS[name].recorded in kept}

    # -- what the parts mean together -------------------------------------------------------------
    @cached_property
    def adapter_table(self) -> AdapterTable:
        """Real backends: the PEFT adapters and dummies the clients map to (the simulator needs no weights).
        Read once per experiment: building it reads every adapter's config file."""
        if not self.backend.real:
            if self.backend.lora:
                raise UserError(
                    "--lora applies to the real backends (--backend torch or triton); the simulator has no weights"
                )
            return AdapterTable()
        return adapter_table(list(self.backend.lora), self.memory.adapters or 0, self.memory.adapter_rank)

    def engine_config(self) -> EngineConfig:
        memory = self.memory
        settings = dict(
            pool_tokens=memory.pool_tokens or get_suite(self.workload.suite).pool_tokens,
            lora_rank=memory.adapter_rank,
            prefix_cache=memory.prefix_cache,
            admission=memory.admission,
            batching=memory.batching,
            max_num_batched_tokens=memory.max_num_batched_tokens,
            max_num_seqs=memory.max_num_seqs,
            block_size=memory.block_size,
        )
        if not self.backend.real:
            return EngineConfig(**settings)
        spec = resolve_spec(self.backend.model_name)
        return EngineConfig(
            **settings, adapter_row_slots=spec.lora_slots_per_row, adapter_sizes=self.adapter_table.sizes(spec)
        )

    def replica_configs(self) -> list[EngineConfig]:
        config = self.engine_config()
        pools = self.cluster.pool_tokens or (config.pool_tokens,)
        return [dataclasses.replace(config, pool_tokens=pools[i % len(pools)]) for i in range(self.cluster.replicas)]

    def replica_testbed(self, i: int) -> str:
        testbeds = self.cluster.testbeds
        return testbeds[i % len(testbeds)] if testbeds else self.backend.testbed

    def backend_settings(self, config: EngineConfig) -> BackendSettings:
        backend = self.backend
        return BackendSettings(
            pool_tokens=config.pool_tokens,
            adapters=self.adapter_table,
            profile=backend.profile,
            testbed=backend.testbed,
            model=backend.model_name,
            device=backend.device,
            dtype=backend.dtype,
            seed=self.workload.seed,
        )

    def requests(self, workload: Workload) -> list[Request]:
        """The workload's requests as the engine sees them (`added_tokens` longer); with `adapters`
        set, client i uses adapter i mod N (or none)."""
        vocab = {"vocab_size": resolve_spec(self.backend.model_name).vocab_size} if self.backend.real else {}
        requests = workload.requests(self.workload.added_tokens, **vocab)
        if self.workload.jitter_ms:
            import numpy as np  # only here: a run without jitter imports no numpy

            rng = np.random.default_rng(self.workload.seed)
            delays = rng.uniform(0.0, self.workload.jitter_ms / 1000, len(requests))
            for r, delay in zip(requests, delays, strict=True):
                r.arrival += float(delay)
        names = self._adapter_names()
        if names is not None:
            index = {c: i for i, c in enumerate(dict.fromkeys([*workload.clients, *(r.client for r in requests)]))}
            for r in requests:
                r.adapter = names[index[r.client] % len(names)] if names else None
        return requests

    def _adapter_names(self) -> list[str] | None:
        """The adapters clients map to in turn; None: the workload's own (one per client)."""
        if self.backend.real:
            return self.adapter_table.names
        adapters = self.memory.adapters
        return None if adapters is None else [f"{DUMMY_PREFIX}{i}" for i in range(adapters)]

    def scheduler_options(self) -> SchedulerOptions:
        scheduling = self.scheduling
        try:
            lift = Lift(scheduling.lift)
        except ValueError:
            known = ", ".join(rule.value for rule in Lift)
            raise UserError(f"unknown lift rule '{scheduling.lift}' (known: {known})") from None
        return SchedulerOptions(
            cost_function(scheduling.cost, self.backend.profile),
            lift,
            scheduling.extra_charge_at_finish,
            self.workload.seed,
            charge_cached=scheduling.charge_cached,
            charge_recompute=scheduling.charge_recompute,
        )


PARTS: dict[str, type] = {field.name: field.type for field in dataclasses.fields(Experiment)}  # part -> its class


def _field(key: Key) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(PARTS[key.part]) if f.name == key.field)


def _by_part(settings: dict) -> dict[str, dict]:
    """Flat settings grouped by part: {part: {field: value}} (a part no key names: left out)."""
    parts: dict[str, dict] = {}
    for name, value in settings.items():
        key = KEYS.get(name)
        if key is None:
            raise TypeError(f"Experiment has no setting '{name}' (known: {', '.join(KEYS)})")
        parts.setdefault(key.part, {})[key.field] = value
    return parts


def cost_function(name: str, profile: str | None = None) -> CostFunction:
    """`linear`, or `profile`: the paper's A10G fit, or a fit to the given profile file."""
    if name == "linear":
        return LinearCost()
    if name == "profile":
        if profile is None:
            return ProfiledCost()
        return ProfiledCost.fit(
            [(p.input_len, p.output_len, 1000 * (p.prefill_s + p.decode_s)) for p in load_profile(profile)]
        )
    raise UserError(f"unknown cost function '{name}' (known: {', '.join(COSTS)})")
