"""The simulated backend: step times from a model fitted to a measured cost profile (DESIGN 4).

prefill(batch) = a + b * requests + c * prompt_tokens + overhead
decode(batch)  = d + e * max(0, requests - knee) + f * context_tokens + overhead   (one step)

A decode step costs about the same for any batch up to the knee (reading the weights dominates),
then grows with the batch; the A10G profile puts the knee near 34 requests. The coefficients are
fitted by least squares on relative error to the profile's per-batch totals (the knee by search).
The profile times the model's forward pass alone; `overhead` is what a serving stack adds to every
forward pass (scheduling, detokenization, IPC), estimated from one measured run by `calibrate.py`.
The same model then serves every figure: nothing is tuned per figure.
"""

from dataclasses import dataclass, replace

import numpy as np

from slora_vtc.backends.base import ModelBackend, StepResult
from slora_vtc.profile import ProfilePoint, load_profile
from slora_vtc.request import Request


@dataclass(frozen=True)
class StepTimeModel:
    prefill_coef: tuple[float, float, float]  # seconds: per batch, per request, per prompt token
    decode_coef: tuple[float, float, float]  # seconds: per step, per request past the knee, per context token
    decode_knee: int = 0  # batch size up to which a decode step costs the same
    overhead_s: float = 0.0  # seconds the serving stack adds to every forward pass

    def prefill_time(self, num_reqs: int, prompt_tokens: int) -> float:
        a, b, c = self.prefill_coef
        return a + b * num_reqs + c * prompt_tokens + self.overhead_s

    def decode_time(self, num_reqs: int, context_tokens: int) -> float:
        d, e, f = self.decode_coef
        return d + e * max(0, num_reqs - self.decode_knee) + f * context_tokens + self.overhead_s

    @classmethod
    def fit(cls, points: list[ProfilePoint]) -> "StepTimeModel":
        prefill_rows = [[1.0, p.batch_size, p.batch_size * p.input_len] for p in points]
        prefill = _fit_nonnegative(prefill_rows, [p.batch_size * p.prefill_s for p in points])
        decode_y = [p.batch_size * p.decode_s for p in points]
        fits = [(_fit_nonnegative(_decode_rows(points, knee), decode_y), knee) for knee in range(max(p.batch_size for p in points))]
        decode, knee = min(fits, key=lambda fit: _relative_sse(_decode_rows(points, fit[1]), decode_y, fit[0]))
        return cls(prefill, decode, knee)

    def residuals(self, points: list[ProfilePoint]) -> list[tuple[ProfilePoint, float, float]]:
        """(point, relative error of prefill, relative error of decode) of the forward-pass model."""
        if self.overhead_s:
            return replace(self, overhead_s=0.0).residuals(points)
        out = []
        for p in points:
            n, x, y = p.batch_size, p.input_len, p.output_len
            prefill = self.prefill_time(n, n * x) / n
            decode = sum(self.decode_time(n, n * (x + k)) for k in range(1, y + 1)) / n
            out.append((p, _relative(prefill, p.prefill_s), _relative(decode, p.decode_s)))
        return out


def _decode_rows(points: list[ProfilePoint], knee: int) -> list[list[float]]:
    """Per point, the totals of each term over its y decode steps (step k attends over x + k)."""
    return [[p.output_len, p.output_len * max(0, p.batch_size - knee),
             p.batch_size * (p.output_len * p.input_len + p.output_len * (p.output_len + 1) / 2)] for p in points]


def _relative_sse(rows, y, coef) -> float:
    y = np.asarray(y)
    return float((((np.asarray(rows) @ np.asarray(coef)) - y) / y) ** 2 @ np.ones(len(y)))


def _relative(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured > 0 else 0.0


def _fit_nonnegative(rows: list[list[float]], y: list[float]) -> tuple[float, ...]:
    """Least squares on relative error; terms that come out negative are dropped and refitted."""
    X, y = np.asarray(rows), np.asarray(y)
    weight = 1.0 / np.maximum(y, 1e-9)
    active = list(range(X.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(X[:, active] * weight[:, None], y * weight, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            full = np.zeros(X.shape[1])
            full[active] = np.maximum(coef, 0)
            return tuple(float(c) for c in full)
        active.pop(int(np.argmin(coef)))


class SimBackend(ModelBackend):
    """No model: each step 'takes' the time the fitted model predicts; tokens are not produced."""

    simulated = True

    def __init__(self, model: StepTimeModel):
        self.model = model

    def prefill(self, reqs: list[Request]) -> StepResult:
        tokens = sum(r.prompt_len for r in reqs)
        return StepResult([None] * len(reqs), self.model.prefill_time(len(reqs), tokens))

    def decode(self, reqs: list[Request]) -> StepResult:
        context = sum(r.prompt_len + r.generated for r in reqs)
        return StepResult([None] * len(reqs), self.model.decode_time(len(reqs), context))


# StepTimeModel.fit() of the A10G / Llama-7B profile (profiles/a10g_llama7b.json; a test checks
# that the refit matches), kept here so that a run does not refit on every start. The overhead is
# `slora-vtc calibrate`'s fit against the artifact's measured VTC overload run (docs/design.md).
A10G_STEP_MODEL = StepTimeModel(
    prefill_coef=(0.04455522335156053, 0.0001843005467338533, 0.0002069428602955795),
    decode_coef=(0.03022487932551086, 0.00022468187696440307, 1.0031000690461657e-06),
    decode_knee=35,
    overhead_s=0.0022,
)


def sim_backend(profile: str | None = None) -> SimBackend:
    """The A10G model by default; a profile file refits the forward pass, keeping the overhead."""
    if profile is None:
        return SimBackend(A10G_STEP_MODEL)
    fitted = StepTimeModel.fit(load_profile(profile))
    return SimBackend(replace(fitted, overhead_s=A10G_STEP_MODEL.overhead_s))
