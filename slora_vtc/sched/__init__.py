"""Fair schedulers behind one interface; build them by name with `build_scheduler`."""

from slora_vtc.sched.base import Scheduler, Traits
from slora_vtc.sched.delegating import Delegating
from slora_vtc.sched.dlpm import DLPM
from slora_vtc.sched.fcfs import FCFS
from slora_vtc.sched.ledger import Ledger
from slora_vtc.sched.limits import RPM, RateLimited
from slora_vtc.sched.lookahead import LookAhead
from slora_vtc.sched.lpm import LPM
from slora_vtc.sched.registry import (
    SCHEDULERS,
    Entry,
    SchedulerOptions,
    build_scheduler,
    register_scheduler,
    scheduler_weights,
    split_specs,
)
from slora_vtc.sched.vtc import VTC, Lift
from slora_vtc.sched.vtc_predict import PredictingVTC

__all__ = [
    "DLPM",
    "FCFS",
    "LPM",
    "RPM",
    "SCHEDULERS",
    "VTC",
    "Delegating",
    "Entry",
    "Ledger",
    "Lift",
    "LookAhead",
    "PredictingVTC",
    "RateLimited",
    "Scheduler",
    "SchedulerOptions",
    "Traits",
    "build_scheduler",
    "register_scheduler",
    "scheduler_weights",
    "split_specs",
]
