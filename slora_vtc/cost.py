"""Service cost functions h(x, y): x input tokens, y output tokens (docs/design.md, "Schedulers").

The schedulers charge h(x, 0) at admission and h(x, n) - h(x, n - 1) for the n-th output token;
the metrics measure service with the same function, so both always agree.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass


class CostFunction(ABC):
    """A monotone service cost; works on floats and on numpy arrays alike."""

    name: str

    @abstractmethod
    def __call__(self, x, y):
        """Service of a request with x input tokens and y output tokens."""


@dataclass(frozen=True)
class LinearCost(CostFunction):
    """The paper's default: w_p * x + w_q * y with w_p = 1, w_q = 2."""

    w_p: float = 1.0
    w_q: float = 2.0
    name: str = "linear"

    def __call__(self, x, y):
        return self.w_p * x + self.w_q * y


# The paper's fit to the A10G / Llama-7B profile, in milliseconds per request (appendix B.2).
A10G_PROFILED = (0.21001891, 0.10075395, 0.0039868, 0.00324733, 1.14601454)


@dataclass(frozen=True)
class ProfiledCost(CostFunction):
    """h(x, y) = a x + b y + c x y + d y^2 + e, fitted to measured per-request time (ms)."""

    coefficients: tuple[float, float, float, float, float] = A10G_PROFILED
    name: str = "profile"

    def __call__(self, x, y):
        a, b, c, d, e = self.coefficients
        return a * x + b * y + c * x * y + d * y * y + e

    @classmethod
    def fit(cls, points: list[tuple[int, int, float]]) -> "ProfiledCost":
        """Least-squares fit to (input_len, output_len, milliseconds per request) points."""
        import numpy as np

        x, y, ms = (np.array(col, dtype=float) for col in zip(*points))
        design = np.stack([x, y, x * y, y * y, np.ones_like(x)], axis=1)
        coef, *_ = np.linalg.lstsq(design, ms, rcond=None)
        return cls(tuple(float(c) for c in coef))
