"""A step-time model fitted to a step log (slora_vtc/steplog.py): `slora-vtc calibrate --vllm-steps LOG
--out TESTBED` writes it, `--testbed TESTBED` simulates with it (docs/vllm.md, "Calibrating the
simulator from vLLM's steps", says why this form).

    step time = base + prefill_token * prefill_tokens + prefill_pair * prefill_pairs
                + decode_req * decode_reqs + context_token * context_tokens      (the step's wall_s)
                + gap                                                             (the host, per step)

The terms are the step log's (and `mixed_time`'s) arguments: the prompt tokens the step computed,
the (new token, earlier position) pairs their attention covers, the requests decoding and the
tokens their attention reads. The wall part is fitted in two stages. Its shape is a least-absolute-
deviation fit (the median step of each shape; iteratively reweighted least squares, a term that
comes out negative dropped), because on a machine shared with other work some steps take many times
their usual time and would pull a least-squares fit wherever they fall. Then all its coefficients
are multiplied by one factor, `slowdown`, that makes the fitted wall times of the log's steps add up
to the measured ones: the machine's time lost to other work, spread over steps in proportion to
their cost. `gap` is the mean time between steps, over the steps that decode something: such a step
continues work the engine already had, so its gap is the host's work between steps; a step that only
starts new prompts may follow an idle engine, whose waiting the simulator models itself (by its
arrivals).

A `VllmStepModel` also answers as the simulator's S-LoRA step model does (`prefill_time`,
`decode_time` and the attributes `SimBackend` reads), a prefill batch and a decode batch being
steps of one kind only, so that a testbed calibrated from vLLM also runs `--batching slora`.
numpy is imported by the fit only: the simulator's run path reads the model without it.
"""

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from slora_vtc.errors import UserError, finite_nonnegative
from slora_vtc.steplog import StepRecord, read_step_log

KIND = "vllm-steps"
MIN_STEPS = 50  # steps that computed something
MIN_OF_EACH = 5  # steps with a prefill, and steps with a decode
TERMS = ("prefill_tokens", "prefill_pairs", "decode_reqs", "context_tokens")
WALL_TERMS = ("base_s", "prefill_token_s", "prefill_pair_s", "decode_req_s", "context_token_s")  # a step's wall


@dataclass(frozen=True)
class VllmStepModel:
    base_s: float  # seconds per step
    prefill_token_s: float  # per prompt token computed
    prefill_pair_s: float  # per (new token, earlier position) pair of a prefill chunk
    decode_req_s: float  # per request decoding
    context_token_s: float  # per token a decode attends over
    gap_s: float = 0.0  # the host's time between two steps

    def mixed_time(self, prefill_tokens: int, prefill_pairs: int, decode_reqs: int, context_tokens: int) -> float:
        """Seconds a step takes, the host's gap after it included."""
        wall = (
            self.base_s
            + self.prefill_token_s * prefill_tokens
            + self.prefill_pair_s * prefill_pairs
            + self.decode_req_s * decode_reqs
            + self.context_token_s * context_tokens
        )
        return wall + self.gap_s

    # -- the S-LoRA loop's model (SimBackend's prefill, decode and decode_run) ---------------------
    cold_start_s = 0.0
    decode_knee = 0

    @property
    def overhead_s(self) -> float:
        return self.gap_s

    @property
    def decode_coef(self) -> tuple[float, float, float]:
        return self.base_s, self.decode_req_s, self.context_token_s

    def prefill_time(self, num_reqs: int, prompt_tokens: int, cached_pairs: int = 0) -> float:
        return self.mixed_time(prompt_tokens, cached_pairs, 0, 0)

    def decode_time(self, num_reqs: int, context_tokens: int) -> float:
        return self.base_s + self.decode_req_s * num_reqs + self.context_token_s * context_tokens + self.gap_s

    # -- files ----------------------------------------------------------------------------------------
    def to_json(self, **about) -> dict:
        return {"kind": KIND, **asdict(self), **about}

    @classmethod
    def from_json(cls, raw: dict) -> "VllmStepModel":
        """The model of a testbed file; a ValueError naming the field that is not a finite number >= 0,
        or saying that the model's steps take no time."""
        values = {}
        for f in fields(cls):
            value = raw.get(f.name, f.default)
            if not finite_nonnegative(value):
                raise ValueError(f"field '{f.name}' must be a finite number >= 0, got {value!r}")
            values[f.name] = float(value)
        model = cls(**values)
        if not any(getattr(model, name) for name in WALL_TERMS):
            raise ValueError(f"{', '.join(WALL_TERMS)} are all 0: every step would take no time (nothing to simulate)")
        return model


@dataclass(frozen=True)
class StepFit:
    """A fitted model and how well it explains the log it was fitted to."""

    model: VllmStepModel
    steps: int
    slowdown: float  # the factor from the median steps' shape to the log's measured time
    measured_wall_s: float  # the log's steps' wall_s, added up (= the model's, by the slowdown)
    median_error: float  # median over steps of |shape - measured| / measured (before the slowdown)
    gap_steps: int  # the steps whose gaps made `gap_s`
    by_kind: dict[str, tuple[int, float, float]]  # kind of step -> (steps, measured wall, fitted wall)
    unmeasured: tuple[str, ...] = ()  # terms no step of the log had (their coefficients are 0)


def fit_steps(records: list[StepRecord], source: str = "the step log") -> StepFit:
    import numpy as np

    steps = [r for r in records if r.prefill_tokens or r.decode_reqs]
    prefills, decodes = sum(r.prefill_tokens > 0 for r in steps), sum(r.decode_reqs > 0 for r in steps)
    if len(steps) < MIN_STEPS or prefills < MIN_OF_EACH or decodes < MIN_OF_EACH:
        raise UserError(
            f"{source}: too few steps to fit: {len(steps)} steps that computed something, {prefills} with a "
            f"prefill, {decodes} with a decode (at least {MIN_STEPS}, and {MIN_OF_EACH} of each kind)"
        )
    _check_clock(steps, source)
    X = np.array([[1.0, *(getattr(r, t) for t in TERMS)] for r in steps])
    y = np.array([r.wall_s for r in steps])
    if not y.any():
        raise UserError(f"{source}: the log's steps took no time (every wall_s is 0): nothing to fit")
    measured = [0, *(k for k in range(1, X.shape[1]) if X[:, k].any())]
    shape = np.zeros(X.shape[1])
    with np.errstate(all="ignore"):  # a fit that overflows is told below
        shape[measured] = _least_absolute_deviations(X[:, measured], y)
        slowdown = float(y.sum() / (X @ shape).sum())
        coef = shape * slowdown
        gaps = [r.gap_s for r in steps if r.decode_reqs]
        model = VllmStepModel(*(float(c) for c in coef), gap_s=float(np.mean(gaps)))
        fitted = X @ coef
    if not (np.isfinite(coef).all() and math.isfinite(model.gap_s) and math.isfinite(slowdown)):
        terms = ", ".join(f"{f.name} {getattr(model, f.name):.3g}" for f in fields(model))
        raise UserError(
            f"{source}: the fitted step time is not finite ({terms}; slowdown {slowdown:.3g}): the log's wall times "
            "cannot be fitted"
        )
    kinds = np.array([_kind(r) for r in steps])
    by_kind = {
        k: (int((kinds == k).sum()), float(y[kinds == k].sum()), float(fitted[kinds == k].sum()))
        for k in ("prefill only", "mixed", "decode only")
        if (kinds == k).any()
    }
    error = float(np.median(np.abs(X @ shape - y) / np.maximum(y, 1e-12)))
    unmeasured = tuple(TERMS[k - 1] for k in range(1, X.shape[1]) if k not in measured)
    return StepFit(model, len(steps), slowdown, float(y.sum()), error, len(gaps), by_kind, unmeasured)


def _check_clock(steps: list[StepRecord], source: str) -> None:
    """A step ends before the next one starts: the walls and gaps of a log add up to its time
    (slora_vtc/vllm/steps.py, slora_vtc/step_logger.py). A log whose clock restarts (logs written
    one after another) is not checked across the restart."""
    for step, after in zip(steps, steps[1:]):
        until = after.t - step.t
        if 0 <= until < step.wall_s - 1e-6 - 1e-9 * after.t:
            raise UserError(
                f"{source}: step {step.step} took {step.wall_s:.6g} s (wall_s), but the next step started "
                f"{until:.6g} s after it began"
            )


def fit_step_log(path: str | Path) -> StepFit:
    records = read_step_log(path)
    if not records:
        raise UserError(f"{path}: the step log is empty")
    return fit_steps(records, str(path))


def save_step_model(fit: StepFit, path: str | Path, source: str) -> None:
    about = {
        "fit": {"log": str(source), "steps": fit.steps, "slowdown": fit.slowdown, "median_error": fit.median_error}
    }
    Path(path).write_text(json.dumps(fit.model.to_json(**about), indent=1) + "\n")


def _kind(r: StepRecord) -> str:
    if r.prefill_tokens and r.decode_reqs:
        return "mixed"
    return "prefill only" if r.prefill_tokens else "decode only"


def _least_absolute_deviations(X, y, iterations: int = 100):
    """Coefficients >= 0 minimising sum |y - X c|, by iteratively reweighted least squares (each
    step's weight 1 / its last absolute residual, floored at a microsecond)."""
    import numpy as np

    weight = np.ones(len(y))
    coef = None
    for _ in range(iterations):
        root = np.sqrt(weight)
        new = _least_squares_nonnegative(X * root[:, None], y * root)
        if coef is not None and np.allclose(new, coef, rtol=1e-7, atol=1e-15):
            return new
        coef = new
        weight = 1.0 / np.maximum(np.abs(y - X @ coef), 1e-6)
    return coef


def _least_squares_nonnegative(X, y):
    """Least squares; a term (never the intercept) that comes out negative is dropped and the rest
    refitted."""
    import numpy as np

    active = list(range(X.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(X[:, active], y, rcond=None)
        negative = [k for k, c in zip(active[1:], coef[1:]) if c < 0]
        if not negative:
            full = np.zeros(X.shape[1])
            full[active] = np.maximum(coef, 0.0)
            return full
        active.remove(min(negative, key=lambda k: coef[active.index(k)]))
