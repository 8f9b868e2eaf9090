"""Serve a workload on a cluster of simulated replicas: one engine, backend and clock each."""

from collections.abc import Callable

from slora_vtc.backends.base import ModelBackend
from slora_vtc.builder import build_engine
from slora_vtc.clock import VirtualClock
from slora_vtc.cluster.cluster import Cluster, StepHook
from slora_vtc.cluster.router import NewScheduler, Router
from slora_vtc.config import EngineConfig
from slora_vtc.engine import Engine
from slora_vtc.progress import LazyProgress
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler


def replica_engine(config: EngineConfig, backend: ModelBackend, scheduler: Scheduler) -> Engine:
    return build_engine(config, scheduler, backend, VirtualClock())


def build_cluster(
    router: Router, configs: list[EngineConfig], backends: list[ModelBackend], new_scheduler: NewScheduler
) -> Cluster:
    """Replica i: configs[i] and backends[i], around the scheduler the router gives it."""
    return Cluster.build(router, lambda i, s: replica_engine(configs[i], backends[i], s), len(configs), new_scheduler)


def serve_cluster(
    cluster: Cluster,
    requests: list[Request],
    progress: bool = False,
    label: str = "",
    horizon: float | None = None,
    on_step: StepHook | None = None,
) -> float:
    """Serve requests arriving at their times until each has ended; returns the total time."""
    with LazyProgress(len(requests), label, enabled=progress) as bar:
        hooks = [_counting(e.on_end, bar) for e in cluster.engines]
        for e, hook in zip(cluster.engines, hooks):
            e.on_end = hook
        cluster.run(requests, until=horizon, on_step=on_step)
    return cluster.now


def _counting(inner: Callable[[Request], None], bar) -> Callable[[Request], None]:
    def ended(req: Request) -> None:
        inner(req)
        bar.update()

    return ended
