"""Backends by name: `sim`, `torch`, `triton`. A new backend is one file (a ModelBackend) plus one
entry here, or `register_backend` from outside the package (docs/extending.md).

Entries import their module only when built, so that the simulator path never imports torch.
"""

from collections.abc import Callable
from dataclasses import dataclass

from slora_vtc.backends.base import ModelBackend
from slora_vtc.backends.sim import DEFAULT_TESTBED
from slora_vtc.config import DEFAULT_POOL_TOKENS
from slora_vtc.errors import UserError
from slora_vtc.model.adapters import AdapterTable


@dataclass(frozen=True, kw_only=True)
class BackendSettings:
    """Everything a backend may need to be built; each backend reads the fields that apply to it."""

    pool_tokens: int = DEFAULT_POOL_TOKENS
    adapters: AdapterTable = AdapterTable()  # real: the LoRA adapters it may serve (PEFT folders and dummies)
    profile: str | None = None  # sim: a cost-profile file to refit the step-time model to
    testbed: str = DEFAULT_TESTBED  # sim: a testbed name, or a file written by `slora-vtc calibrate --out`
    model: str | None = None  # real: a ModelSpec name or a Hugging Face folder
    device: str | None = None
    dtype: str | None = None
    seed: int = 0


@dataclass(frozen=True)
class BackendEntry:
    build: Callable[[BackendSettings], ModelBackend]
    help: str
    default_model: str | None = None  # None: the backend runs no model (and takes no --model)

    @property
    def runs_model(self) -> bool:
        return self.default_model is not None


def _sim(settings: BackendSettings) -> ModelBackend:
    from slora_vtc.backends.sim import sim_backend

    return sim_backend(settings.testbed, settings.profile)


def _llama(ops: str) -> Callable[[BackendSettings], ModelBackend]:
    def build(s: BackendSettings) -> ModelBackend:
        from slora_vtc.backends.llama import build_backend  # imports torch

        return build_backend(
            ops, s.model or BACKENDS[ops].default_model, s.pool_tokens, s.adapters, s.device, s.dtype, s.seed
        )

    return build


BACKENDS: dict[str, BackendEntry] = {
    "sim": BackendEntry(_sim, "simulated: step times from a model fitted to a cost profile (no tokens)"),
    "torch": BackendEntry(_llama("torch"), "Llama with torch ops (CPU, or a GPU with --device cuda)", "tiny"),
    "triton": BackendEntry(_llama("triton"), "Llama with our Triton kernels (a CUDA GPU)", "llama-7b"),
}


def get_backend(name: str) -> BackendEntry:
    if name not in BACKENDS:
        raise UserError(f"unknown backend '{name}' (known: {', '.join(BACKENDS)})")
    return BACKENDS[name]


def build_backend(name: str, settings: BackendSettings) -> ModelBackend:
    return get_backend(name).build(settings)


def register_backend(name: str, entry: BackendEntry) -> BackendEntry:
    """Add a backend (from a plugin); a name that is taken is an error."""
    if name in BACKENDS:
        raise UserError(f"backend '{name}' is already registered")
    BACKENDS[name] = entry
    return entry
