"""Run an Experiment (slora_vtc/experiment.py) into a RunResult: its workload's requests served by one
engine, or by a cluster of simulated replicas behind routers.

The same path serves simulated and real runs; only the backend (and so the clock, which the engine
builder picks) differs.
"""

from dataclasses import replace
from typing import TYPE_CHECKING

from slora_vtc.backends.base import ModelBackend
from slora_vtc.backends.registry import build_backend
from slora_vtc.builder import build_engine
from slora_vtc.config import EngineConfig
from slora_vtc.errors import UserError
from slora_vtc.experiment import Experiment
from slora_vtc.model.spec import resolve_spec
from slora_vtc.progress import LazyProgress
from slora_vtc.request import Request
from slora_vtc.results import RunResult
from slora_vtc.sched import Scheduler, build_scheduler
from slora_vtc.workload import Workload

if TYPE_CHECKING:
    from slora_vtc.cluster import RouterOptions


def run_experiment(
    exp: Experiment, progress: bool = False, macro_steps: bool = True, step_log: str | None = None
) -> RunResult:
    """Run one experiment; every request ends finished, rejected or aborted. `macro_steps=False`
    runs the simulator one decode step at a time (what the macro-step tests compare against);
    `step_log`: a file to write one record per forward pass to (slora_vtc/steplog.py)."""
    if exp.cluster.clustered:
        if step_log is not None:
            raise UserError("--step-log logs one engine: it does not apply to --replicas or --routers")
        return run_cluster_experiment(exp, progress, macro_steps)
    workload, config = exp.workload.build(), replace(exp.engine_config(), macro_steps=macro_steps)
    requests = exp.requests(workload)
    if exp.backend.real:
        check_context(exp.backend.model_name, requests)
    backend = build_backend(exp.backend.name, exp.backend_settings(config))
    scheduler = build_scheduler(exp.scheduling.scheduler, list(workload.clients), exp.scheduler_options())
    label = f"{workload.name}/{exp.scheduling.scheduler} ({exp.backend.name})"
    total = serve_requests(
        requests, scheduler, config, backend, exp.backend.time_scale, progress, label, exp.workload.horizon, step_log
    )
    return RunResult.of(exp.result_config(config.pool_tokens, workload.duration), requests, total)


def run_cluster_experiment(exp: Experiment, progress: bool = False, macro_steps: bool = True) -> RunResult:
    """Several simulated replicas behind a router; the result records each request's replica.
    `macro_steps=False`: every replica runs one decode step at a time."""
    from slora_vtc.cluster import build_router  # only for a cluster run: a single engine's start skips it
    from slora_vtc.cluster.serve import build_cluster, serve_cluster

    if exp.backend.real:
        raise UserError("--replicas and --routers run on the simulator only (--backend sim)")
    workload = exp.workload.build()
    configs = [replace(c, macro_steps=macro_steps) for c in exp.replica_configs()]
    requests = exp.requests(workload)
    backends = [
        build_backend(exp.backend.name, replace(exp.backend_settings(c), testbed=exp.replica_testbed(i)))
        for i, c in enumerate(configs)
    ]
    router = build_router(exp.cluster.router, router_options(exp, workload))
    cluster = build_cluster(
        router,
        configs,
        backends,
        lambda: build_scheduler(exp.scheduling.scheduler, list(workload.clients), exp.scheduler_options()),
    )
    label = f"{workload.name}/{exp.scheduling.scheduler} x{exp.cluster.replicas} ({exp.cluster.router})"
    total = serve_cluster(cluster, requests, progress, label, exp.workload.horizon)
    result_config = exp.result_config(configs[0].pool_tokens, workload.duration)
    return RunResult.of(result_config, requests, total, cluster.replica_of)


def router_options(exp: Experiment, workload: Workload) -> "RouterOptions":
    from slora_vtc.cluster import RouterOptions

    cluster = exp.cluster
    return RouterOptions(
        tuple(workload.clients), exp.workload.seed, cluster.routers, cluster.router_sync, cluster.ingress_skew
    )


def serve_requests(
    requests: list[Request],
    scheduler: Scheduler,
    config: EngineConfig,
    backend: ModelBackend,
    time_scale: float = 1.0,
    progress: bool = False,
    label: str = "",
    horizon: float | None = None,
    step_log: str | None = None,
) -> float:
    """Serve requests arriving at their times until each has ended; returns the total time.

    A simulated backend runs on a virtual clock; a real one on the wall clock, scaled by `time_scale`.
    `step_log`: write one record per forward pass there.
    """
    with LazyProgress(len(requests), label, enabled=progress) as bar:
        engine = build_engine(config, scheduler, backend, on_end=lambda _: bar.update(), time_scale=time_scale)
        if step_log is not None:
            engine.log_steps(step_log)
        try:
            engine.run(requests, until=horizon)
        finally:
            if engine.step_log is not None:
                engine.step_log.close()
    return engine.clock.now()


def check_context(model: str, requests: list[Request]) -> None:
    """Refuse, before loading anything, a workload whose longest request outgrows the model's context."""
    context = resolve_spec(model).max_position
    longest = max(requests, key=lambda r: r.prompt_len + r.max_new_tokens, default=None)
    if longest is not None and longest.prompt_len + longest.max_new_tokens > context:
        need = longest.prompt_len + longest.max_new_tokens
        raise UserError(
            f"model '{model}': its context is {context} tokens (max_position_embeddings), but the workload's "
            f"longest request needs {need} ({longest.prompt_len} prompt + {longest.max_new_tokens} new tokens)"
        )
