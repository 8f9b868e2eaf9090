"""A step-time model fitted to a step log (slora_vtc/steplog.py): `slora-vtc calibrate --vllm-steps LOG
--out TESTBED` writes it, `--testbed TESTBED` simulates with it (docs/vllm.md, "Calibrating the
simulator from vLLM's steps", says why this form).

    step time = base + prefill_token * prefill_tokens + prefill_pair * prefill_pairs
                + decode_req * decode_reqs + context_token * context_tokens      (the step's wall_s)
                + gap                                                             (the host, per step)

The terms are the step log's (and `mixed_time`'s) arguments: the prompt tokens the step computed,
the (new token, earlier position) pairs their attention covers, the requests decoding and the
tokens their attention reads. The wall part is fitted by least squares on seconds, not relative
error, so that the fitted times of the log's steps add up to its measured time (the intercept sees
to it); a term that comes out negative is dropped and the rest refitted. `gap` is the mean time
between steps, over the steps that decode something: such a step continues work the engine already
had, so its gap is the host's work between steps; a step that only starts new prompts may follow an
idle engine, whose waiting the simulator models itself (by its arrivals).

A `VllmStepModel` also answers as the simulator's S-LoRA step model does (`prefill_time`,
`decode_time` and the attributes `SimBackend` reads), a prefill batch and a decode batch being
steps of one kind only, so that a testbed calibrated from vLLM also runs `--batching slora`.
numpy is imported by the fit only: the simulator's run path reads the model without it.
"""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from slora_vtc.errors import UserError
from slora_vtc.steplog import StepRecord, read_step_log

KIND = "vllm-steps"
MIN_STEPS = 50  # steps that computed something
MIN_OF_EACH = 5  # steps with a prefill, and steps with a decode
TERMS = ("prefill_tokens", "prefill_pairs", "decode_reqs", "context_tokens")


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
        values = {}
        for f in fields(cls):
            value = raw.get(f.name, f.default)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"'{f.name}' must be a number >= 0, got {value!r}")
            values[f.name] = float(value)
        return cls(**values)


@dataclass(frozen=True)
class StepFit:
    """A fitted model and how well it explains the log it was fitted to."""

    model: VllmStepModel
    steps: int
    measured_wall_s: float  # the log's steps' wall_s, added up
    fitted_wall_s: float  # the model's wall part for the same steps, added up
    rms_s: float  # root mean square of the per-step residuals of wall_s
    gap_steps: int  # the steps whose gaps made `gap_s`
    by_kind: dict[str, tuple[int, float, float]]  # kind of step -> (steps, measured wall, fitted wall)


def fit_steps(records: list[StepRecord], source: str = "the step log") -> StepFit:
    import numpy as np

    steps = [r for r in records if r.prefill_tokens or r.decode_reqs]
    prefills, decodes = sum(r.prefill_tokens > 0 for r in steps), sum(r.decode_reqs > 0 for r in steps)
    if len(steps) < MIN_STEPS or prefills < MIN_OF_EACH or decodes < MIN_OF_EACH:
        raise UserError(
            f"{source}: too few steps to fit: {len(steps)} steps that computed something, {prefills} with a "
            f"prefill, {decodes} with a decode (at least {MIN_STEPS}, and {MIN_OF_EACH} of each kind)"
        )
    X = np.array([[1.0, *(getattr(r, t) for t in TERMS)] for r in steps])
    y = np.array([r.wall_s for r in steps])
    coef = _least_squares_nonnegative(X, y)
    gaps = [r.gap_s for r in steps if r.decode_reqs]
    model = VllmStepModel(*(float(c) for c in coef), gap_s=float(np.mean(gaps)))
    fitted = X @ coef
    kinds = np.array([_kind(r) for r in steps])
    by_kind = {
        k: (int((kinds == k).sum()), float(y[kinds == k].sum()), float(fitted[kinds == k].sum()))
        for k in ("prefill only", "mixed", "decode only")
        if (kinds == k).any()
    }
    return StepFit(model, len(steps), float(y.sum()), float(fitted.sum()),
                   float(np.sqrt(np.mean((fitted - y) ** 2))), len(gaps), by_kind)  # fmt: skip


def fit_step_log(path: str | Path) -> StepFit:
    records = read_step_log(path)
    if not records:
        raise UserError(f"{path}: the step log is empty")
    return fit_steps(records, str(path))


def save_step_model(fit: StepFit, path: str | Path, source: str) -> None:
    about = {"fit": {"log": str(source), "steps": fit.steps, "rms_s": fit.rms_s}}
    Path(path).write_text(json.dumps(fit.model.to_json(**about), indent=1) + "\n")


def _kind(r: StepRecord) -> str:
    if r.prefill_tokens and r.decode_reqs:
        return "mixed"
    return "prefill only" if r.prefill_tokens else "decode only"


def _least_squares_nonnegative(X, y):
    """Least squares on seconds; a term (never the intercept) that comes out negative is dropped and
    the rest refitted."""
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
