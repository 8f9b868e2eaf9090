"""Passthrough: no order of its own, for a driver in front of a fair scheduler downstream.

The gateway in front of vLLM running our plugin (slora_vtc.vllm) should not hold requests back:
the plugin orders them inside vLLM, where it sees the batch. This scheduler's trait `defers` tells
a driver so (the gateway then gives each upstream every request at once; docs/gateway.md). Where
requests must wait anyway (an engine's memory, a fixed `--max-inflight`), they wait in arrival
order, as under FCFS; it charges nothing and keeps no counters.
"""

from slora_vtc.sched.base import Traits
from slora_vtc.sched.fcfs import FCFS


class Passthrough(FCFS):
    traits = Traits(preemption=True, lookahead=True, defers=True)
