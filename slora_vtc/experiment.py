"""One experiment: a suite's workload served by one scheduler on one backend, as a RunResult."""

from dataclasses import asdict, dataclass, replace

from tqdm import tqdm

from slora_vtc.backends.base import ModelBackend
from slora_vtc.backends.sim import SimBackend, StepTimeModel
from slora_vtc.clock import VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.cost import CostFunction, LinearCost, ProfiledCost
from slora_vtc.engine import Engine
from slora_vtc.errors import UserError
from slora_vtc.profile import load_profile
from slora_vtc.request import Request
from slora_vtc.results import RunResult
from slora_vtc.sched import Lift, SchedulerOptions, build_scheduler
from slora_vtc.workloads import Workload, get_suite

# StepTimeModel.fit() of the artifact's A10G / Llama-7B profile (a test checks the refit matches),
# so the simulator runs without the shared data folder. The overhead comes from
# `slora-vtc calibrate` against the artifact's measured VTC overload run (see paper_repro.md).
A10G_STEP_MODEL = StepTimeModel(
    prefill_coef=(0.04455522335156053, 0.0001843005467338533, 0.0002069428602955795),
    decode_coef=(0.03022487932551086, 0.00022468187696440307, 1.0031000690461657e-06),
    decode_knee=35,
    overhead_s=0.0022,
)
COSTS = ("linear", "profile")
BACKENDS = ("sim", "torch", "triton")
DEFAULT_MODEL = {"torch": "tiny", "triton": "llama-7b"}
REAL_ONLY = ("model", "time_scale", "device", "dtype")  # fields a simulated run leaves out of its result file


@dataclass(frozen=True)
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
    backend: str = "sim"
    trace: str | None = None  # a trace file for a trace suite (default: the paper's LMSYS trace)
    model: str | None = None  # real backends: a ModelSpec name or a Hugging Face folder (default: DEFAULT_MODEL)
    adapters: int | None = None  # LoRA adapters the clients map to, round robin (default: one per client; 0: none)
    adapter_rank: int = 8
    time_scale: float = 1.0  # real backends: workload seconds per wall-clock second
    device: str | None = None  # real backends (default: cpu for torch, cuda for triton)
    dtype: str | None = None  # real backends (default: float32 on a CPU, float16 on a GPU)

    @property
    def real_backend(self) -> bool:
        return self.backend != "sim"

    @property
    def model_name(self) -> str | None:
        return (self.model or DEFAULT_MODEL.get(self.backend, "tiny")) if self.real_backend else None

    def engine_config(self) -> EngineConfig:
        row_slots = 1
        if self.real_backend:
            from slora_vtc.model.spec import resolve_spec  # torch-free

            row_slots = resolve_spec(self.model_name).lora_slots_per_row
        pool = self.pool_tokens or get_suite(self.suite).pool_tokens
        return EngineConfig(pool_tokens=pool, lora_rank=self.adapter_rank, adapter_row_slots=row_slots)

    def requests(self, workload: Workload) -> list[Request]:
        """The workload's requests; with `adapters` set, client i uses adapter i mod N (or none)."""
        requests = workload.requests()
        if self.adapters is not None:
            index = {c: i for i, c in enumerate(dict.fromkeys([*workload.clients, *(r.client for r in requests)]))}
            for r in requests:
                r.adapter = f"adapter{index[r.client] % self.adapters}" if self.adapters else None
        return requests

    def result_config(self, config: EngineConfig, workload: Workload) -> dict:
        fields = {**asdict(self), "model": self.model_name, "pool_tokens": config.pool_tokens, "duration": workload.duration}
        return {k: v for k, v in fields.items() if self.real_backend or k not in REAL_ONLY}

    def workload(self) -> Workload:
        return get_suite(self.suite).workload(self.duration, self.seed, self.trace)

    def scheduler_options(self) -> SchedulerOptions:
        try:
            lift = Lift(self.lift)
        except ValueError:
            raise UserError(f"unknown lift rule '{self.lift}' (known: {', '.join(l.value for l in Lift)})") from None
        return SchedulerOptions(cost_function(self.cost, self.profile), lift, self.extra_charge_at_finish, self.seed)


def cost_function(name: str, profile: str | None = None) -> CostFunction:
    """`linear`, or `profile`: the paper's A10G fit, or a fit to the given profile file."""
    if name == "linear":
        return LinearCost()
    if name == "profile":
        if profile is None:
            return ProfiledCost()
        return ProfiledCost.fit([(p.input_len, p.output_len, 1000 * (p.prefill_s + p.decode_s)) for p in load_profile(profile)])
    raise UserError(f"unknown cost function '{name}' (known: {', '.join(COSTS)})")


def sim_backend(profile: str | None = None) -> SimBackend:
    """The A10G model by default; a profile file refits the forward pass, keeping the overhead."""
    if profile is None:
        return SimBackend(A10G_STEP_MODEL)
    fitted = StepTimeModel.fit(load_profile(profile))
    return SimBackend(replace(fitted, overhead_s=A10G_STEP_MODEL.overhead_s))


def simulate(
    workload: Workload,
    scheduler: str,
    options: SchedulerOptions,
    config: EngineConfig,
    backend: ModelBackend,
    progress: bool = False,
    label: str = "",
    requests: list[Request] | None = None,
) -> tuple[list, float]:
    """Serve a workload on a virtual clock; returns the ended requests and the total time."""
    requests = workload.requests() if requests is None else requests
    engine_scheduler = build_scheduler(scheduler, list(workload.clients), options)
    with tqdm(total=len(requests), desc=label or f"{workload.name}/{scheduler}", unit="req", disable=not progress, leave=False) as bar:
        clock = VirtualClock()
        engine = Engine(config, engine_scheduler, backend, clock, on_end=lambda _: bar.update())
        engine.run(requests)
    return requests, clock.now()


def run_experiment(exp: Experiment, progress: bool = False) -> RunResult:
    """Run one experiment; every request ends finished, rejected or aborted."""
    if exp.backend not in BACKENDS:
        raise UserError(f"unknown backend '{exp.backend}' (known: {', '.join(BACKENDS)})")
    workload, config = exp.workload(), exp.engine_config()
    if exp.real_backend:
        from slora_vtc.realrun import serve  # imports torch

        requests, total = serve(exp, workload, config, progress)
    else:
        backend = sim_backend(exp.profile)
        requests, total = simulate(workload, exp.scheduler, exp.scheduler_options(), config, backend, progress, requests=exp.requests(workload))
    return RunResult.of(exp.result_config(config, workload), requests, total)
