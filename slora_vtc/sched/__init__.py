"""Fair schedulers behind one interface; build them by name with `build_scheduler`."""

from slora_vtc.sched.base import Scheduler
from slora_vtc.sched.dlpm import DLPM
from slora_vtc.sched.fcfs import FCFS
from slora_vtc.sched.limits import RPM, RateLimited
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

__all__ = [
    "DLPM",
    "FCFS",
    "LPM",
    "RPM",
    "SCHEDULERS",
    "VTC",
    "Entry",
    "Lift",
    "RateLimited",
    "Scheduler",
    "SchedulerOptions",
    "build_scheduler",
    "register_scheduler",
    "scheduler_weights",
    "split_specs",
]
