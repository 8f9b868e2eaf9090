"""The rotary embedding's inverse frequencies, scaled as a model's config says (spec.RopeScaling).

Computed once per model; every rotary op (torch, reference, Triton) takes them as they are.
"""

import math

import torch

from slora_vtc.model.spec import ModelSpec, RopeScaling


def inverse_frequencies(spec: ModelSpec, device: str | torch.device = "cpu") -> torch.Tensor:
    """[head_dim / 2] fp32: theta^(-2i / head_dim), then scaled."""
    return scaled(default_frequencies(spec.head_dim, spec.rope_theta, device), spec.rope_scaling)


def default_frequencies(head_dim: int, theta: float, device: str | torch.device = "cpu") -> torch.Tensor:
    # fp32 exponents, as the kernels computed them before scaling existed: the same numbers to the bit
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def scaled(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    if scaling.kind == "default":
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        return _llama3(inv_freq, scaling)
    raise ValueError(f"unknown RoPE scaling '{scaling.kind}'")


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Wavelengths longer than original / low_freq_factor are stretched by `factor`, those shorter
    than original / high_freq_factor kept; in between, a linear blend in original / wavelength."""
    wavelength = 2 * math.pi / inv_freq
    stretched = inv_freq / s.factor
    blend = (
        (s.original_max_position / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    ).clamp(0.0, 1.0)
    return (1 - blend) * stretched + blend * inv_freq
