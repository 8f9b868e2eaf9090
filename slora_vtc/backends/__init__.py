"""Backends answer 'run this prefill / decode step' and report how long it took."""

from slora_vtc.backends.base import ModelBackend, StepResult
from slora_vtc.backends.registry import (
    BACKENDS,
    BackendEntry,
    BackendSettings,
    build_backend,
    get_backend,
    register_backend,
)

__all__ = [
    "BACKENDS",
    "BackendEntry",
    "BackendSettings",
    "ModelBackend",
    "StepResult",
    "build_backend",
    "get_backend",
    "register_backend",
]
