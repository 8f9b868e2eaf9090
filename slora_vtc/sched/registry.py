"""Schedulers by name, built from a spec string such as `vtc`, `rpm:20`, `wvtc:1,2,3,4`, `lpm` or `lpm:128`."""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from slora_vtc.cost import CostFunction, LinearCost
from slora_vtc.errors import UserError
from slora_vtc.sched.base import Scheduler
from slora_vtc.sched.dlpm import DLPM
from slora_vtc.sched.fcfs import FCFS
from slora_vtc.sched.limits import RPM
from slora_vtc.sched.lpm import LPM
from slora_vtc.sched.passthrough import Passthrough
from slora_vtc.sched.vtc import VTC, Lift
from slora_vtc.sched.vtc_predict import (
    LengthPredictor,
    MovingAveragePredictor,
    OraclePredictor,
    PredictingVTC,
    UniformErrorPredictor,
)
from slora_vtc.specs import positive_arg, register_spec, resolve_spec


@dataclass(frozen=True)
class SchedulerOptions:
    """Settings shared by every scheduler of a run."""

    cost: CostFunction = field(default_factory=LinearCost)
    lift: Lift = Lift.PAPER
    extra_charge_at_finish: bool = False  # the artifact's quirk, off by default
    seed: int = 42  # for the randomised length predictor
    charge_cached: float = 1.0  # weight of a cached prompt token in VTC's charge (1: the paper's VTC)
    charge_recompute: bool = False  # charge again the K/V a preempted request computes again

    def __post_init__(self):
        if not 0 <= self.charge_cached <= 1:
            raise UserError(f"--charge-cached must be in [0, 1], got {self.charge_cached}")


Factory = Callable[[str | None, list[str], SchedulerOptions], Scheduler]


@dataclass(frozen=True)
class Entry:
    factory: Factory
    help: str
    arg: str | None = None  # name of the argument, if any (required unless `optional`)
    optional: bool = False  # the argument may be left out: the factory then gets None

    def usage(self, name: str) -> str:
        """How a spec names it: `vtc`, `rpm:LIMIT`, `lpm:[N]`."""
        if not self.arg:
            return name
        return f"{name}:[{self.arg}]" if self.optional else f"{name}:{self.arg}"


def _vtc(opts: SchedulerOptions, predictor: LengthPredictor | None = None, **kwargs) -> VTC:
    kwargs.setdefault("lift", opts.lift)
    settings = dict(
        cost=opts.cost,
        extra_charge_at_finish=opts.extra_charge_at_finish,
        charge_cached=opts.charge_cached,
        charge_recompute=opts.charge_recompute,
        **kwargs,
    )
    return VTC(**settings) if predictor is None else PredictingVTC(predictor, **settings)


def _lpm(spec: str, text: str | None) -> LPM:
    return LPM(fcfs_above=None if text is None else _positive_int(spec, text, "the FCFS fallback threshold"))


def _positive_int(spec: str, text: str, what: str = "the limit") -> int:
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"scheduler '{spec}': '{text}' is not an integer") from None
    if value <= 0:
        raise UserError(f"scheduler '{spec}': {what} must be positive, got {value}")
    return value


def _weights(spec: str, text: str, clients: list[str]) -> dict[str, float]:
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        raise UserError(f"scheduler '{spec}': weights must be numbers, got '{text}'") from None
    if any(not 0 < w < math.inf for w in weights):  # NaN too
        raise UserError(f"scheduler '{spec}': weights must be positive and finite, got {text}")
    if len(weights) != len(clients):
        raise UserError(f"scheduler '{spec}': {len(weights)} weights for {len(clients)} clients")
    return dict(zip(clients, weights))


def _ratio(spec: str, text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        raise UserError(f"scheduler '{spec}': '{text}' is not a number") from None
    if not 0 <= r < 1:
        raise UserError(f"scheduler '{spec}': the error ratio must be in [0, 1), got {r}")
    return r


SCHEDULERS: dict[str, Entry] = {
    "fcfs": Entry(lambda a, c, o: FCFS(), "first come, first served"),
    "passthrough": Entry(
        lambda a, c, o: Passthrough(), "FCFS that leaves the order downstream (the gateway before vLLM's plugin)"
    ),
    "rpm": Entry(
        lambda a, c, o: RPM(_positive_int(f"rpm:{a}", a)),
        "FCFS + reject above LIMIT requests/minute per client",
        "LIMIT",
    ),
    "lcf": Entry(lambda a, c, o: _vtc(o, lift=Lift.NONE), "least counter first (VTC without the lift)"),
    "vtc": Entry(lambda a, c, o: _vtc(o), "virtual token counter"),
    "wvtc": Entry(
        lambda a, c, o: _vtc(o, weights=_weights(f"wvtc:{a}", a, c)),
        "weighted VTC, one weight per client in order",
        "W1,W2,...",
    ),
    "vtc-oracle": Entry(
        lambda a, c, o: _vtc(o, predictor=OraclePredictor()), "VTC charging the true output length up front"
    ),
    "vtc-pred": Entry(
        lambda a, c, o: _vtc(o, predictor=UniformErrorPredictor(_ratio(f"vtc-pred:{a}", a), o.seed)),
        "VTC with a prediction uniform in actual*(1 +- R)",
        "R",
    ),
    "vtc-avg": Entry(
        lambda a, c, o: _vtc(o, predictor=MovingAveragePredictor()), "VTC predicting a per-client moving average"
    ),
    "lpm": Entry(
        lambda a, c, o: _lpm(f"lpm:{a}", a),
        "longest cached prefix first (SGLang); FCFS above N waiting, if given",
        "N",
        optional=True,
    ),
    "dlpm": Entry(
        lambda a, c, o: DLPM(
            positive_arg("scheduler", f"dlpm:{a}", a, "the quantum"), charge_recompute=o.charge_recompute
        ),
        "deficit LPM: LPM order, admission gated by per-client deficits refilled by quantum Q",
        "Q",
    ),
}


def scheduler_weights(spec: str, clients: list[str]) -> dict[str, float] | None:
    """The per-client weights a `wvtc:W1,W2,...` spec gives (None for an unweighted scheduler)."""
    name, _, arg = spec.partition(":")
    return _weights(spec, arg, clients) if name == "wvtc" else None


def register_scheduler(name: str, entry: Entry) -> Entry:
    """Add a scheduler (from a plugin, see docs/extending.md); a name that is taken is an error."""
    return register_spec("scheduler", name, entry, SCHEDULERS)


def split_specs(texts: list[str]) -> list[str]:
    """Scheduler specs from `--schedulers vtc fcfs wvtc:1,2,3,4` or `vtc,fcfs,rpm:30`.

    A comma separates two specs only where the next piece starts a scheduler name; otherwise it
    belongs to the argument before it (`wvtc:1,2,3,4`, `vtc,wvtc:1,2`).
    """
    specs: list[str] = []
    for text in texts:
        for piece in text.split(","):
            if specs and specs[-1].partition(":")[1] and piece.partition(":")[0] not in SCHEDULERS:
                specs[-1] += "," + piece
            elif piece:
                specs.append(piece)
    return specs


def build_scheduler(spec: str, clients: list[str], options: SchedulerOptions = SchedulerOptions()) -> Scheduler:
    """Build a scheduler from `name` or `name:ARG`; raise UserError naming what is wrong."""
    entry, arg = resolve_spec("scheduler", spec, SCHEDULERS)
    return entry.factory(arg, clients, options)
