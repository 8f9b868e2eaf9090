"""Output-length predictors for VTC with length prediction (paper appendix B.3)."""

from abc import ABC, abstractmethod

import numpy as np

from slora_vtc.request import Request


class LengthPredictor(ABC):
    @abstractmethod
    def predict(self, req: Request) -> float:
        """Predicted output length of a request about to be admitted."""

    def observe(self, req: Request) -> None:
        """Learn from a finished request."""


class OraclePredictor(LengthPredictor):
    """Knows the true output length."""

    def predict(self, req: Request) -> float:
        return float(req.max_new_tokens)


class UniformErrorPredictor(LengthPredictor):
    """Uniform in [actual * (1 - r), actual * (1 + r)]: the paper's +-50% predictor for r = 0.5."""

    def __init__(self, r: float, seed: int):
        self.r = r
        self._rng = np.random.default_rng(seed)

    def predict(self, req: Request) -> float:
        actual = req.max_new_tokens
        return float(self._rng.uniform(actual * (1 - self.r), actual * (1 + self.r)))


class MovingAveragePredictor(LengthPredictor):
    """Per client: first prediction is the first actual length, then pred = (4 * pred + actual) / 5.

    Before a client's first request finishes there is nothing to go on, so it predicts 0 (plain VTC).
    """

    def __init__(self):
        self._average: dict[str, float] = {}

    def predict(self, req: Request) -> float:
        return self._average.get(req.client, 0.0)

    def observe(self, req: Request) -> None:
        prev = self._average.get(req.client)
        actual = float(req.generated)
        self._average[req.client] = actual if prev is None else (4 * prev + actual) / 5
