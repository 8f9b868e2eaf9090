"""What a running server is made of (model, tokenizer, clients, engine service), built from ServerConfig."""

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from slora_vtc.config import EngineConfig
from slora_vtc.errors import UserError
from slora_vtc.model.adapters import AdapterTable, adapter_table
from slora_vtc.model.spec import ModelSpec, is_folder, resolve_spec
from slora_vtc.server.service import EngineService
from slora_vtc.server.tokenizer import Tokenizer, load_tokenizer
from slora_vtc.serving.clients import Clients, load_clients, scheduler_for
from slora_vtc.serving.front_door import FrontDoor


@dataclass(frozen=True)
class ServerConfig(FrontDoor):
    """`serve`'s settings: the front door's (serving/front_door.py), the model's and the engine's."""

    model: str = "tiny"  # a spec name (dummy weights) or a Hugging Face model folder
    # the names the base model answers to (vLLM's --served-model-name): the first one is the one /v1/models lists
    # first and every response says; none: the spec's name or the folder's
    served_model_names: tuple[str, ...] = ()
    scheduler: str = "vtc"
    pool_tokens: int = 10_000
    lora: tuple[str, ...] = ()  # PEFT adapters, NAME=PATH
    dummy_adapters: int = 0  # also this many dummy adapters (dummy-0 ..), of rank adapter_rank
    adapter_rank: int = 8
    backend: str = "torch"
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    tokenizer: str | None = None  # a tokenizer folder, or "byte"; default: the model folder's, else bytes
    max_client_labels: int = 100  # /metrics labels this many clients by name (the busiest); the rest are client="other"
    max_inflight: int = 4096  # generation requests handled at once over HTTP; more get a 503 with Retry-After
    backlog: int = 4096  # the listening socket's backlog (connections not yet accepted)
    prefix_cache: bool = False  # share the K/V of common prompt prefixes (radix tree in the pool)
    # S-LoRA's loop or vLLM's chunked steps: EngineConfig's fields of the same names, with its defaults
    batching: str = EngineConfig.batching
    max_num_batched_tokens: int = EngineConfig.max_num_batched_tokens
    max_num_seqs: int = EngineConfig.max_num_seqs
    block_size: int = EngineConfig.block_size
    step_log: str | None = None  # write one JSON line per engine step here (slora_vtc/steplog.py)
    # the engine in a process of its own (engine_process.py), not a thread of this one: `serve`'s default; off here,
    # where tests and tools build many servers in one process
    engine_process: bool = False

    def check(self) -> None:
        super().check()
        for flag, value in (
            ("--max-client-labels", self.max_client_labels),
            ("--max-inflight", self.max_inflight),
            ("--backlog", self.backlog),
        ):
            if value <= 0:
                raise UserError(f"{flag} must be positive, got {value}")
        if any(not name.strip() for name in self.served_model_names):
            raise UserError("--served-model-name must not be empty")


@dataclass(frozen=True)
class ServerContext:
    config: ServerConfig
    spec: ModelSpec
    tokenizer: Tokenizer
    clients: Clients
    adapters: AdapterTable
    engine_config: EngineConfig
    service: EngineService  # or engine_process.RemoteService, which offers the same

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names the base model answers to, the one responses say first."""
        return tuple(dict.fromkeys(self.config.served_model_names)) or (own_name(self.config.model),)

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @property
    def base_model_aliases(self) -> tuple[str, ...]:
        """What a request's `model` may say for the base model: its served names; without --served-model-name,
        also the --model given (a folder's path)."""
        given = () if self.config.served_model_names else (self.config.model,)
        return tuple(dict.fromkeys((*self.model_names, *given)))


def own_name(model: str) -> str:
    """A model's name without --served-model-name: a folder's name, else the spec's."""
    return Path(model).name if is_folder(model) else model


def check_served_names(config: ServerConfig, adapters: AdapterTable) -> None:
    """A served name must not also name a LoRA adapter: a request naming it would be ambiguous."""
    clash = next((name for name in config.served_model_names if name in adapters), None)
    if clash is not None:
        raise UserError(f"--served-model-name '{clash}' is also the name of a LoRA adapter")


def engine_config_for(config: ServerConfig, spec: ModelSpec, clients: Clients, adapters: AdapterTable) -> EngineConfig:
    """The engine's config; every adapter the clients file names must be one the server has (whether each fits the
    pool, build_backend checks)."""
    for client in [*clients.named.values(), clients.default]:
        for name in client.adapter_names:
            if name not in adapters:
                known = ", ".join(adapters.names) or "none: give --lora NAME=PATH or --dummy-adapters N"
                who = "[default]" if client is clients.default else f"client '{client.name}'"
                raise UserError(
                    f"{config.clients_file}: {who} uses LoRA adapter '{name}', which this server does not have "
                    f"(known: {known})"
                )
    return EngineConfig(
        pool_tokens=config.pool_tokens,
        lora_rank=0,
        adapter_row_slots=spec.lora_slots_per_row,
        adapter_sizes=adapters.sizes(spec),
        prefix_cache=config.prefix_cache,
        batching=config.batching,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        block_size=config.block_size,
    )


def build_context(config: ServerConfig) -> ServerContext:
    """Check everything, then load the model (the slow part) and wire engine, backend and pool."""
    config.check()
    spec = resolve_spec(config.model)
    tokenizer = load_tokenizer(config.model, spec, config.tokenizer)
    clients = load_clients(config.clients_file)
    adapters = adapter_table(list(config.lora), config.dummy_adapters, config.adapter_rank)
    check_served_names(config, adapters)
    engine_config = engine_config_for(config, spec, clients, adapters)
    build_service = partial(engine_service, config, engine_config, clients, adapters)
    if config.engine_process:
        from slora_vtc.server.engine_process import start_engine_process

        scheduler_for(config.scheduler, clients)  # a bad scheduler is refused here, before a process starts
        service = start_engine_process(build_service)
    else:
        service = build_service()
    return ServerContext(config, spec, tokenizer, clients, adapters, engine_config, service)


def engine_service(
    config: ServerConfig, engine_config: EngineConfig, clients: Clients, adapters: AdapterTable
) -> EngineService:
    """The engine and its thread (in the server's process, or in the engine process: picklable arguments)."""
    engine = _engine(config, engine_config, scheduler_for(config.scheduler, clients), adapters)
    if config.step_log is not None:
        engine.log_steps(config.step_log)
    return EngineService(engine, config.client_idle_s, config.max_client_labels, config.max_waiting)


def _engine(config: ServerConfig, engine_config: EngineConfig, scheduler, adapters: AdapterTable):
    from slora_vtc.backends.registry import BackendSettings, build_backend
    from slora_vtc.builder import build_engine

    settings = BackendSettings(
        pool_tokens=config.pool_tokens,
        adapters=adapters,
        model=config.model,
        device=config.device,
        dtype=config.dtype,
        seed=config.seed,
    )
    backend = build_backend(config.backend, settings)
    return build_engine(engine_config, scheduler, backend)  # a real backend: on the wall clock
