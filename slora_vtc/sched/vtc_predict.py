"""VTC with output-length prediction (paper appendix B.3): charge the predicted output up front, refund
what it overshot.

At admission the client is charged h(x, p) for the prompt and the predicted output length p. The
n-th token costs nothing while n <= p, and h(x, n) - h(x, max(n - 1, p)) beyond it. When the
request ends with y tokens, a prediction that overshot (p > y) is refunded h(x, y) - h(x, p). So a
request costs h(x, max(y, p)) while it runs and exactly h(x, y) once it has ended, as plain VTC
(p = 0) charges it. The predictors: the true length (oracle), a draw uniform in [(1 - r) y, (1 + r) y]
(seeded), and a per-client moving average (the first value is the first real length, then
(4 p + y) / 5).
"""

from abc import ABC, abstractmethod

from slora_vtc.request import Request
from slora_vtc.sched.vtc import VTC, Record


class LengthPredictor(ABC):
    @abstractmethod
    def predict(self, req: Request) -> float:
        """Predicted output length of a request about to be admitted."""

    def observe(self, req: Request) -> None:  # noqa: B027 (a predictor that learns nothing keeps this)
        """Learn from a finished request."""


class OraclePredictor(LengthPredictor):
    """Knows the true output length."""

    def predict(self, req: Request) -> float:
        return float(req.max_new_tokens)


class UniformErrorPredictor(LengthPredictor):
    """Uniform in [actual * (1 - r), actual * (1 + r)]: the paper's +-50% predictor for r = 0.5."""

    def __init__(self, r: float, seed: int):
        self.r = r
        import numpy as np  # only for this predictor: a plain run imports no numpy

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

    def observe(self, req: Request) -> None:  # noqa: B027 (a predictor that learns nothing keeps this)
        prev = self._average.get(req.client)
        actual = float(req.generated)
        self._average[req.client] = actual if prev is None else (4 * prev + actual) / 5


class PredictingVTC(VTC):
    """VTC charging a predicted output length up front and refunding what it overshot (module docstring)."""

    refunds = True

    def __init__(self, predictor: LengthPredictor, **vtc):
        super().__init__(**vtc)
        self.predictor = predictor

    def admission_charge(self, req: Request, record: Record) -> float:
        record.predicted = self.predictor.predict(req)
        return self.cost(record.input, record.predicted)

    def token_charge(self, req: Request) -> float:
        record, n = self.records[req.rid], req.generated + 1
        record.charged = n
        x, p = record.input, record.predicted
        if n <= p:
            return 0.0
        return self.cost(x, n) - self.cost(x, max(n - 1, p))

    KNOWN_TO_LOOKAHEAD = {**VTC.KNOWN_TO_LOOKAHEAD, "token_charge": token_charge}

    def settle(self, req: Request) -> float:
        """Refund a prediction that overshot what the request actually received; forget it."""
        record = self.records.pop(req.rid)
        x, predicted = record.input, record.predicted
        if predicted > req.generated:
            return self._charge(req.client, self.cost(x, req.generated) - self.cost(x, predicted))
        return 0.0

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> float:
        charged = super().on_finish(finished, batch, now)
        for req in finished:
            self.predictor.observe(req)
        return charged
