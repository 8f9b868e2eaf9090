"""One experiment: a suite's workload served by one scheduler on one backend, as a RunResult.

The same function serves simulated and real runs; only the backend (and so the clock) differs.
"""

from dataclasses import asdict, dataclass, replace
from functools import cached_property

from slora_vtc.backends.base import ModelBackend
from slora_vtc.backends.registry import BackendSettings, build_backend, get_backend
from slora_vtc.backends.sim import DEFAULT_TESTBED
from slora_vtc.clock import VirtualClock, WallClock
from slora_vtc.cluster import RouterOptions, build_router
from slora_vtc.config import EngineConfig
from slora_vtc.cost import CostFunction, LinearCost, ProfiledCost
from slora_vtc.engine import Engine
from slora_vtc.errors import UserError
from slora_vtc.memory import build_memory
from slora_vtc.model.adapters import DUMMY_PREFIX, AdapterTable, adapter_table
from slora_vtc.model.spec import resolve_spec
from slora_vtc.profile import load_profile
from slora_vtc.progress import LazyProgress
from slora_vtc.request import Request
from slora_vtc.results import RunResult
from slora_vtc.sched import Lift, Scheduler, SchedulerOptions, build_scheduler
from slora_vtc.suites import get_suite
from slora_vtc.workload import Workload

COSTS = ("linear", "profile")
REAL_ONLY = ("model", "time_scale", "device", "dtype")  # fields a simulated run leaves out of its result file
CLUSTER_ONLY = (
    "replicas",
    "router",
    "routers",
    "router_sync",
    "ingress_skew",
    "replica_pool_tokens",
    "replica_testbeds",
)  # and a single engine's
SIM_ONLY = ("testbed",)  # and those a real run leaves out


@dataclass(frozen=True, kw_only=True)
class Experiment:
    suite: str
    scheduler: str
    pool_tokens: int | None = None  # default: the suite's
    duration: float | None = None  # default: the suite's
    seed: int = 42
    cost: str = "linear"
    lift: str = "paper"
    extra_charge_at_finish: bool = False
    profile: str | None = None  # a cost-profile file to calibrate the simulator (and cost) with
    testbed: str = DEFAULT_TESTBED  # the simulator's testbed (slora_vtc.backends.sim.TESTBEDS), or a testbed file
    added_tokens: int = 1  # tokens the serving path adds to each prompt: the artifact's server prepends a BOS
    jitter_ms: float = 0.0  # each arrival comes up to this much later (uniform, seeded by `seed`): for ensembles
    load_scale: int = 1  # every request sent this many times (a cluster of N replicas at one engine's load: N)
    backend: str = "sim"
    prefix_cache: bool = False  # share K/V of common prompt prefixes (a radix tree in the pool)
    admission: str = "conservative"  # or optimistic: admit while slots are free, preempt by recompute
    charge_cached: float = 1.0  # VTC: weight of a cached prompt token (1: the paper's VTC; 0: extend tokens only)
    charge_recompute: bool = False  # VTC: charge again the tokens a preempted request recomputes
    horizon: float | None = None  # stop at this time, aborting what has not finished (default: serve every request)
    trace: str | None = None  # a trace file for a trace suite (default: the paper's LMSYS trace)
    model: str | None = None  # real backends: a ModelSpec name or a Hugging Face folder (default: the backend's)
    adapters: int | None = None  # dummy LoRA adapters the clients map to, round robin (default: one per client on the
    # simulator, none on a real backend; 0: none)
    adapter_rank: int = 8  # rank of the dummy adapters
    lora: tuple[str, ...] = ()  # real backends: PEFT adapters as NAME=PATH; the clients map to these (then the dummies)
    time_scale: float = 1.0  # real backends: workload seconds per wall-clock second
    device: str | None = None  # real backends (default: cpu for torch, cuda for triton)
    dtype: str | None = None  # real backends (default: float32 on a CPU, float16 on a GPU)
    replicas: int = 1  # engines behind a router (1: one engine, today's path)
    router: str = "round-robin"  # a router spec (slora_vtc.cluster.ROUTERS)
    routers: int = 1  # global-vtc: router instances, each with its own counters
    router_sync: float | None = None  # their counters become cluster-wide every S s (None: never)
    ingress_skew: float = 0.0  # share of a client's requests entering by its home router (the rest go round robin)
    replica_pool_tokens: tuple[int, ...] = ()  # pool of replica i: entry i mod len (default: pool_tokens for all)
    replica_testbeds: tuple[str, ...] = ()  # testbed of replica i: entry i mod len (default: testbed for all)

    @property
    def real_backend(self) -> bool:
        return get_backend(self.backend).runs_model

    @property
    def model_name(self) -> str | None:
        return (self.model or get_backend(self.backend).default_model) if self.real_backend else None

    @cached_property
    def adapter_table(self) -> AdapterTable:
        """Real backends: the PEFT adapters and dummies the clients map to (the simulator needs no weights).
        Read once per experiment: building it reads every adapter's config file."""
        if not self.real_backend:
            if self.lora:
                raise UserError(
                    "--lora applies to the real backends (--backend torch or triton); the simulator has no weights"
                )
            return AdapterTable()
        return adapter_table(list(self.lora), self.adapters or 0, self.adapter_rank)

    def engine_config(self) -> EngineConfig:
        pool = self.pool_tokens or get_suite(self.suite).pool_tokens
        memory = dict(
            pool_tokens=pool, lora_rank=self.adapter_rank, prefix_cache=self.prefix_cache, admission=self.admission
        )
        if not self.real_backend:
            return EngineConfig(**memory)
        spec = resolve_spec(self.model_name)
        return EngineConfig(
            **memory, adapter_row_slots=spec.lora_slots_per_row, adapter_sizes=self.adapter_table.sizes(spec)
        )

    @property
    def clustered(self) -> bool:
        """Whether the run goes through the cluster loop (several replicas, or several routers)."""
        return self.replicas > 1 or self.routers > 1

    def replica_configs(self) -> list[EngineConfig]:
        config = self.engine_config()
        pools = self.replica_pool_tokens or (config.pool_tokens,)
        return [replace(config, pool_tokens=pools[i % len(pools)]) for i in range(self.replicas)]

    def replica_testbed(self, i: int) -> str:
        return self.replica_testbeds[i % len(self.replica_testbeds)] if self.replica_testbeds else self.testbed

    def router_options(self, workload: Workload) -> RouterOptions:
        return RouterOptions(tuple(workload.clients), self.seed, self.routers, self.router_sync, self.ingress_skew)

    def backend_settings(self, config: EngineConfig) -> BackendSettings:
        return BackendSettings(
            pool_tokens=config.pool_tokens,
            adapters=self.adapter_table,
            profile=self.profile,
            testbed=self.testbed,
            model=self.model_name,
            device=self.device,
            dtype=self.dtype,
            seed=self.seed,
        )

    def requests(self, workload: Workload) -> list[Request]:
        """The workload's requests as the engine sees them (`added_tokens` longer); with `adapters`
        set, client i uses adapter i mod N (or none)."""
        vocab = {"vocab_size": resolve_spec(self.model_name).vocab_size} if self.real_backend else {}
        requests = workload.requests(self.added_tokens, **vocab)
        if self.jitter_ms:
            import numpy as np

            delays = np.random.default_rng(self.seed).uniform(0.0, self.jitter_ms / 1000, len(requests))
            for r, delay in zip(requests, delays):
                r.arrival += float(delay)
        names = self._adapter_names()
        if names is not None:
            index = {c: i for i, c in enumerate(dict.fromkeys([*workload.clients, *(r.client for r in requests)]))}
            for r in requests:
                r.adapter = names[index[r.client] % len(names)] if names else None
        return requests

    def _adapter_names(self) -> list[str] | None:
        """The adapters clients map to in turn; None: the workload's own (one per client)."""
        if self.real_backend:
            return self.adapter_table.names
        return None if self.adapters is None else [f"{DUMMY_PREFIX}{i}" for i in range(self.adapters)]

    def result_config(self, config: EngineConfig, workload: Workload) -> dict:
        fields = {
            **asdict(self),
            "model": self.model_name,
            "pool_tokens": config.pool_tokens,
            "duration": workload.duration,
        }
        left_out = (SIM_ONLY if self.real_backend else REAL_ONLY) + (() if self.clustered else CLUSTER_ONLY)
        return {k: v for k, v in fields.items() if k not in left_out}

    def workload(self) -> Workload:
        return get_suite(self.suite).workload(self.duration, self.seed, self.trace).scaled(self.load_scale)

    def scheduler_options(self) -> SchedulerOptions:
        try:
            lift = Lift(self.lift)
        except ValueError:
            raise UserError(f"unknown lift rule '{self.lift}' (known: {', '.join(l.value for l in Lift)})") from None
        return SchedulerOptions(
            cost_function(self.cost, self.profile),
            lift,
            self.extra_charge_at_finish,
            self.seed,
            charge_cached=self.charge_cached,
            charge_recompute=self.charge_recompute,
        )


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


def serve_requests(
    requests: list[Request],
    scheduler: Scheduler,
    config: EngineConfig,
    backend: ModelBackend,
    time_scale: float = 1.0,
    progress: bool = False,
    label: str = "",
    horizon: float | None = None,
) -> float:
    """Serve requests arriving at their times until each has ended; returns the total time.

    A simulated backend runs on a virtual clock; a real one on the wall clock, scaled by `time_scale`.
    """
    backend.warmup()
    clock = VirtualClock() if backend.simulated else WallClock(time_scale)
    memory = build_memory(config, backend)
    with LazyProgress(len(requests), label, enabled=progress) as bar:
        Engine(config, scheduler, backend, clock, memory, on_end=lambda _: bar.update()).run(requests, until=horizon)
    return clock.now()


def check_context(model: str, requests: list[Request]) -> None:
    """Refuse, before loading anything, a workload whose longest request outgrows the model's context."""
    context = resolve_spec(model).max_position
    longest = max(requests, key=lambda r: r.prompt_len + r.max_new_tokens, default=None)
    if longest is not None and longest.prompt_len + longest.max_new_tokens > context:
        raise UserError(
            f"model '{model}': its context is {context} tokens (max_position_embeddings), but the workload's longest request "
            f"needs {longest.prompt_len + longest.max_new_tokens} ({longest.prompt_len} prompt + {longest.max_new_tokens} new tokens)"
        )


def run_experiment(exp: Experiment, progress: bool = False, macro_steps: bool = True) -> RunResult:
    """Run one experiment; every request ends finished, rejected or aborted. `macro_steps=False`
    runs the simulator one decode step at a time (what the macro-step tests compare against)."""
    if exp.clustered:
        return run_cluster_experiment(exp, progress)
    workload, config = exp.workload(), replace(exp.engine_config(), macro_steps=macro_steps)
    requests = exp.requests(workload)
    if exp.real_backend:
        check_context(exp.model_name, requests)
    backend = build_backend(exp.backend, exp.backend_settings(config))
    scheduler = build_scheduler(exp.scheduler, list(workload.clients), exp.scheduler_options())
    total = serve_requests(
        requests,
        scheduler,
        config,
        backend,
        exp.time_scale,
        progress,
        f"{workload.name}/{exp.scheduler} ({exp.backend})",
        exp.horizon,
    )
    return RunResult.of(exp.result_config(config, workload), requests, total)


def run_cluster_experiment(exp: Experiment, progress: bool = False) -> RunResult:
    """Several simulated replicas behind a router; the result records each request's replica."""
    from slora_vtc.cluster.serve import build_cluster, serve_cluster  # (and tqdm): only for a cluster run

    if exp.real_backend:
        raise UserError("--replicas and --routers run on the simulator only (--backend sim)")
    workload, configs = exp.workload(), exp.replica_configs()
    requests = exp.requests(workload)
    backends = [
        build_backend(exp.backend, replace(exp.backend_settings(c), testbed=exp.replica_testbed(i)))
        for i, c in enumerate(configs)
    ]
    router = build_router(exp.router, exp.router_options(workload))
    cluster = build_cluster(
        router,
        configs,
        backends,
        lambda: build_scheduler(exp.scheduler, list(workload.clients), exp.scheduler_options()),
    )
    label = f"{workload.name}/{exp.scheduler} x{exp.replicas} ({exp.router})"
    total = serve_cluster(cluster, requests, progress, label, exp.horizon)
    return RunResult.of(exp.result_config(configs[0], workload), requests, total, cluster.replica_of)
