"""Workload suites: the paper's seeded workloads and trace replays, and the prefix-sharing suites
after the DLPM paper (suites/prefix.py), by name (`get_suite`)."""

from slora_vtc.suites.base import Suite
from slora_vtc.suites.registry import SUITES, get_suite, register_suite

__all__ = ["SUITES", "Suite", "get_suite", "register_suite"]
