"""Backends answer 'run this prefill / decode step' and report how long it took."""

from slora_vtc.backends.base import ModelBackend, StepResult
from slora_vtc.backends.sim import SimBackend, StepTimeModel

__all__ = ["ModelBackend", "SimBackend", "StepResult", "StepTimeModel"]
