"""The simulated backend: step times from a model fitted to a measured cost profile, plus what a
testbed's serving path adds (docs/design.md, "The simulator and its calibration").

prefill(batch) = a + b * requests + c * extend_tokens + g * sum_i(extend_i * cached_i) + overhead
decode(batch)  = d + e * max(0, requests - knee) + f * context_tokens + overhead   (one step)
and once, on the first forward pass after start-up, + cold_start.

extend_i: the tokens request i's prefill computes (its whole prompt without the prefix cache);
cached_i: the tokens before them whose K/V it reuses, which each new token attends over. g is fitted
to a profile's prefix-hit points when it has them; otherwise g = f / 128: a flash-attention tile of
128 queries reads each cached K/V once, as a decode step does for one query. On the A10G with
Llama-7B that is 7.8e-9 s per (new, cached) pair; the compute bound (4 * 4096 * 32 FLOPs per pair
at ~60 TFLOP/s) gives 8.7e-9 s, within 10 %.

A decode step costs about the same for any batch up to the knee (reading the weights dominates),
then grows with the batch. a to f are fitted by least squares on relative error to the profile's
per-batch totals, the knee's position by search; the knee's form itself was chosen after comparing
with the artifact's measured VTC run. The profile times the model alone: `overhead` (per forward
pass) and `cold_start` are a testbed's, measured by slora_vtc.calibrate on one measured run of
that testbed's session. Nothing is tuned per figure.
"""

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from slora_vtc.backends.base import Chunk, ModelBackend, StepResult
from slora_vtc.errors import UserError, finite_nonnegative
from slora_vtc.request import Request

if TYPE_CHECKING:  # profiles are read, and numpy fits to them, only when a run refits the model
    from slora_vtc.calibrate_steps import VllmStepModel
    from slora_vtc.profile import PrefixHitPoint, ProfilePoint

TILE_QUERIES = 128  # queries of one attention tile: each cached K/V is read once per tile


@dataclass(frozen=True)
class StepTimeModel:
    prefill_coef: tuple[float, float, float]  # seconds: per batch, per request, per prompt token
    decode_coef: tuple[float, float, float]  # seconds: per step, per request past the knee, per context token
    decode_knee: int = 0  # batch size up to which a decode step costs the same
    overhead_s: float = 0.0  # seconds the serving stack adds to every forward pass
    cold_start_s: float = 0.0  # seconds the first forward pass after start-up takes longer (no warm-up)
    cached_coef: float | None = None  # seconds per (new token, cached token) pair; None: decode's f / TILE_QUERIES

    @property
    def cached_pair_s(self) -> float:
        return self.decode_coef[2] / TILE_QUERIES if self.cached_coef is None else self.cached_coef

    def prefill_time(self, num_reqs: int, prompt_tokens: int, cached_pairs: int = 0) -> float:
        """`prompt_tokens`: the tokens computed; `cached_pairs`: sum over requests of new x cached tokens."""
        a, b, c = self.prefill_coef
        t = a + b * num_reqs + c * prompt_tokens
        if cached_pairs:
            t += self.cached_pair_s * cached_pairs
        return t + self.overhead_s

    def decode_time(self, num_reqs: int, context_tokens: int) -> float:
        d, e, f = self.decode_coef
        return d + e * max(0, num_reqs - self.decode_knee) + f * context_tokens + self.overhead_s

    def mixed_time(self, prefill_tokens: int, prefill_pairs: int, decode_reqs: int, context_tokens: int) -> float:
        """One step of chunked batching (prefill chunks and decodes in one forward pass), from the
        prefill and decode coefficients (docs/design.md, "Chunked batching"): the pass's fixed cost
        once (a when it prefills: its weights are read and its kernels launched once, as a prefill's;
        d, the decode step's, when it only decodes), c per prompt token, g per pair of a chunk's token
        and a position before the chunk (attention over earlier K/V, as over a cached prefix), and the
        decodes' own terms, e per request past the knee and f per context token. Without chunks it
        is decode_time exactly; a prefill's per-request b, which the step does not see, is left out."""
        if not prefill_tokens:
            return self.decode_time(decode_reqs, context_tokens)
        a, _, c = self.prefill_coef
        d, e, f = self.decode_coef
        t = max(a, d) + c * prefill_tokens + self.cached_pair_s * prefill_pairs
        if decode_reqs:
            t += e * max(0, decode_reqs - self.decode_knee) + f * context_tokens
        return t + self.overhead_s

    @classmethod
    def fit(cls, points: "list[ProfilePoint]") -> "StepTimeModel":
        prefill_rows = [[1.0, p.batch_size, p.batch_size * p.input_len] for p in points]
        prefill = _fit_nonnegative(prefill_rows, [p.batch_size * p.prefill_s for p in points])
        decode_y = [p.batch_size * p.decode_s for p in points]
        fits = [
            (_fit_nonnegative(_decode_rows(points, knee), decode_y), knee)
            for knee in range(max(p.batch_size for p in points))
        ]
        decode, knee = min(fits, key=lambda fit: _relative_sse(_decode_rows(points, fit[1]), decode_y, fit[0]))
        return cls(prefill, decode, knee)

    def with_prefix_hits(self, hits: "list[PrefixHitPoint]") -> "StepTimeModel":
        """g fitted to prefill times measured over a cached prefix (least squares on relative error,
        what the rest of the prefill model does not explain); unchanged without hit points."""
        if not hits:
            return self
        import numpy as np

        n = np.array([h.batch_size for h in hits], dtype=float)
        y = n * np.array([h.prefill_s for h in hits])
        x = n * np.array([h.extend_len * h.cached_len for h in hits], dtype=float)
        rest = np.array([self.prefill_time(h.batch_size, h.batch_size * h.extend_len) - self.overhead_s for h in hits])
        w = 1.0 / np.maximum(y, 1e-9) ** 2
        g = float(((y - rest) * x * w).sum() / max((x * x * w).sum(), 1e-30))
        return replace(self, cached_coef=max(0.0, g))

    def residuals(self, points: "list[ProfilePoint]") -> "list[tuple[ProfilePoint, float, float]]":
        """(point, relative error of prefill, relative error of decode) of the forward-pass model."""
        if self.overhead_s or self.cold_start_s:
            return replace(self, overhead_s=0.0, cold_start_s=0.0).residuals(points)
        out = []
        for p in points:
            n, x, y = p.batch_size, p.input_len, p.output_len
            prefill = self.prefill_time(n, n * x) / n
            decode = sum(self.decode_time(n, n * (x + k)) for k in range(1, y + 1)) / n
            out.append((p, _relative(prefill, p.prefill_s), _relative(decode, p.decode_s)))
        return out


def _decode_rows(points: "list[ProfilePoint]", knee: int) -> list[list[float]]:
    """Per point, the totals of each term over its y decode steps (step k attends over x + k)."""
    return [
        [
            p.output_len,
            p.output_len * max(0, p.batch_size - knee),
            p.batch_size * (p.output_len * p.input_len + p.output_len * (p.output_len + 1) / 2),
        ]
        for p in points
    ]


def _relative_sse(rows, y, coef) -> float:
    import numpy as np

    y = np.asarray(y)
    return float((((np.asarray(rows) @ np.asarray(coef)) - y) / y) ** 2 @ np.ones(len(y)))


def _relative(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured > 0 else 0.0


def _fit_nonnegative(rows: list[list[float]], y: list[float]) -> tuple[float, ...]:
    """Least squares on relative error; terms that come out negative are dropped and refitted."""
    import numpy as np

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
    decodes_ahead = True
    mixes = True

    def __init__(self, model: StepTimeModel):
        self.model = model
        self._cold = model.cold_start_s > 0

    def prefill(self, reqs: list[Request]) -> StepResult:
        extend = [r.prefill_len - r.cached_len for r in reqs]
        elapsed = self.model.prefill_time(len(reqs), sum(extend), sum(e * r.cached_len for e, r in zip(extend, reqs)))
        if self._cold:  # the engine's first forward pass is always a prefill
            elapsed, self._cold = elapsed + self.model.cold_start_s, False
        return StepResult([None] * len(reqs), elapsed)

    def decode(self, reqs: list[Request]) -> StepResult:
        context = sum(r.prompt_len + r.generated for r in reqs)
        return StepResult([None] * len(reqs), self.model.decode_time(len(reqs), context))

    def mixed(self, chunks: list[Chunk], decodes: list[Request]) -> StepResult:
        prefill = sum(c.length for c in chunks)
        pairs = sum(c.length * c.start for c in chunks)
        context = sum([r.prompt_len + r.generated for r in decodes])
        elapsed = self.model.mixed_time(prefill, pairs, len(decodes), context)
        if self._cold:  # the engine's first step always prefills
            elapsed, self._cold = elapsed + self.model.cold_start_s, False
        return StepResult([None] * (len(chunks) + len(decodes)), elapsed)

    def decode_run(self, reqs: list[Request], steps: int, start: float, until: float) -> tuple[int, float]:
        if not isinstance(self.model, StepTimeModel):  # another model (a calibrated one): its own step times
            return self._mixed_run(reqs, steps, start, until)
        # decode_time's terms, summed in its order, and the clock's sum step by step: the same floats
        d, e, f = self.model.decode_coef
        n = len(reqs)
        fixed, overhead = d + e * max(0, n - self.model.decode_knee), self.model.overhead_s
        context, now = sum([r.prompt_len + r.generated for r in reqs]), start
        for done in range(1, steps + 1):
            now += fixed + f * context + overhead
            if now >= until:
                return done, now
            context += n
        return steps, now

    def _mixed_run(self, reqs: list[Request], steps: int, start: float, until: float) -> tuple[int, float]:
        n, context, now = len(reqs), sum(r.prompt_len + r.generated for r in reqs), start
        for done in range(1, steps + 1):
            now += self.model.mixed_time(0, 0, n, context)
            if now >= until:
                return done, now
            context += n
        return steps, now


# StepTimeModel.fit() of the A10G / Llama-7B profile (profiles/a10g_llama7b.json; a test checks
# that the refit matches), kept here so that a run does not refit on every start.
A10G_STEP_MODEL = StepTimeModel(
    prefill_coef=(0.04455522335156053, 0.0001843005467338533, 0.0002069428602955795),
    decode_coef=(0.03022487932551086, 0.00022468187696440307, 1.0031000690461657e-06),
    decode_knee=35,
)

# A testbed is the profile's forward pass plus what one measured session of the serving stack
# adds to it, as slora_vtc.calibrate measures it on that session's reference run (a test checks
# these numbers against the procedure). The artifact measured its runs in two sessions whose decode
# steps differ by 2.6 %: June 2024 (its VTC overload run; also every real-trace run) and December
# 2023 (its FCFS overload run).
TESTBEDS: dict[str, StepTimeModel] = {
    "a10g-2024": replace(A10G_STEP_MODEL, overhead_s=0.00166, cold_start_s=1.16),  # data/measured/vtc_overload.jsonl
    "a10g-2023": replace(A10G_STEP_MODEL, overhead_s=0.00292, cold_start_s=0.84),  # data/measured/fcfs_overload.jsonl
}
DEFAULT_TESTBED = "a10g-2024"


def load_testbed(name: str) -> "StepTimeModel | VllmStepModel":
    """A built-in testbed by name, or a testbed file written by `slora-vtc calibrate --out` (from a
    profile and a measured run, or from a step log: `"kind": "vllm-steps"`)."""
    if name in TESTBEDS:
        return TESTBEDS[name]
    path = Path(name)
    if not path.is_file():
        raise UserError(
            f"unknown testbed '{name}' (known: {', '.join(TESTBEDS)}, or a file written by `slora-vtc calibrate --out`)"
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a testbed file ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: not a testbed file (a JSON object of a testbed's fields, got {type(raw).__name__})")
    try:
        if "kind" in raw:
            if raw["kind"] != "vllm-steps":
                raise ValueError(f"unknown kind {raw['kind']!r} (known: 'vllm-steps', or no kind)")
            from slora_vtc.calibrate_steps import VllmStepModel

            return VllmStepModel.from_json(raw)
        return _step_time_model(raw)
    except ValueError as e:
        raise UserError(f"{path}: not a testbed file: {e}") from None


FIELDS_OF_A_TESTBED = ("prefill_coef", "decode_coef", "decode_knee", "overhead_s", "cold_start_s")


def _step_time_model(raw: dict) -> StepTimeModel:
    """A testbed file of `save_testbed`'s form, every field checked: its coefficients and seconds
    finite numbers >= 0 (as StepTimeModel.fit and slora_vtc.calibrate make them), the knee a whole
    number >= 0, `cached_coef` such a number or null; a ValueError naming the field otherwise."""
    missing = [name for name in FIELDS_OF_A_TESTBED if name not in raw]
    if missing:
        raise ValueError(f"missing field '{missing[0]}'")
    coefs = {}
    for name in ("prefill_coef", "decode_coef"):
        value = raw[name]
        if not isinstance(value, list) or len(value) != 3 or not all(finite_nonnegative(v) for v in value):
            raise ValueError(f"field '{name}' must be a list of 3 finite numbers >= 0, got {value!r}")
        coefs[name] = tuple(float(v) for v in value)
    for name in ("overhead_s", "cold_start_s"):
        if not finite_nonnegative(raw[name]):
            raise ValueError(f"field '{name}' must be a finite number >= 0, got {raw[name]!r}")
    knee = raw["decode_knee"]
    if not finite_nonnegative(knee) or knee != int(knee):
        raise ValueError(f"field 'decode_knee' must be a whole number >= 0, got {knee!r}")
    cached = raw.get("cached_coef")
    if cached is not None and not finite_nonnegative(cached):
        raise ValueError(f"field 'cached_coef' must be a finite number >= 0 or null, got {cached!r}")
    model = StepTimeModel(
        coefs["prefill_coef"],
        coefs["decode_coef"],
        int(knee),
        float(raw["overhead_s"]),
        float(raw["cold_start_s"]),
        None if cached is None else float(cached),
    )
    if not any([*model.prefill_coef, *model.decode_coef, model.overhead_s, cached or 0.0]):
        raise ValueError(
            "every coefficient and 'overhead_s' are 0: every step would take no time (nothing to simulate)"
        )
    return model


def save_testbed(model: StepTimeModel, path: str | Path) -> None:
    Path(path).write_text(json.dumps(asdict(model), indent=1) + "\n")


def sim_backend(testbed: str = DEFAULT_TESTBED, profile: str | None = None) -> SimBackend:
    """A testbed's model; a profile file refits its forward pass, keeping what the testbed adds."""
    model = load_testbed(testbed)
    if profile is not None:
        from slora_vtc.profile import load_prefix_hits, load_profile

        fitted = StepTimeModel.fit(load_profile(profile)).with_prefix_hits(load_prefix_hits(profile))
        model = replace(fitted, overhead_s=model.overhead_s, cold_start_s=model.cold_start_s)
    return SimBackend(model)
