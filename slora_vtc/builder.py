"""The one way to build an engine (docs/design.md, "Architecture"): experiments, the cluster's replicas,
the server, `generate` and the tests all come here, so that an engine never lacks its memory manager
or a real backend's adapter weights.

The builder owns what every engine needs beside its scheduler and backend: the backend's warm-up,
the token pool and the memory manager over it (adapters loaded into their slots by the backend,
the prefix cache when the config asks for it; a pool that only counts where nothing reads slot ids)
and the clock: virtual time for a simulated backend,
the wall clock (scaled by `time_scale`) for a real one, started after the warm-up so that compiling
kernels takes no time of the run. A caller that needs another clock (the cluster's replicas share
virtual time; `generate` times nothing) passes its own.
"""

from slora_vtc.backends.base import ModelBackend
from slora_vtc.clock import Clock, VirtualClock, WallClock
from slora_vtc.config import EngineConfig
from slora_vtc.engine import EndHook, Engine
from slora_vtc.memory import CountingPool, MemoryManager, TokenPool
from slora_vtc.sched.base import Scheduler


def build_engine(
    config: EngineConfig,
    scheduler: Scheduler,
    backend: ModelBackend,
    clock: Clock | None = None,
    on_end: EndHook | None = None,
    time_scale: float = 1.0,
) -> Engine:
    """An engine serving `config`'s pool with `scheduler` on `backend`, warmed up; `on_end` hears of
    every request that ends."""
    backend.warmup()
    if clock is None:
        clock = VirtualClock() if backend.simulated else WallClock(time_scale)
    return Engine(config, scheduler, backend, clock, build_memory(config, backend), on_end)


def build_memory(config: EngineConfig, backend: ModelBackend) -> MemoryManager:
    """The memory manager an engine with this backend needs: slot ids where something reads them
    (a real backend's K/V cache and adapter weights, the prefix cache's tree), counts otherwise (a
    simulated backend without the prefix cache, whose runs then give the same result files faster)."""
    if backend.simulated and not config.prefix_cache:
        return MemoryManager(CountingPool(config.pool_tokens), config.slots_of)
    return MemoryManager(
        TokenPool(config.pool_tokens), config.slots_of, on_load=backend.load_adapter, cache=config.prefix_cache,
        hit_unit=config.block_size if config.chunked else 1,
        vllm_cache=config.chunked,
    )  # fmt: skip
