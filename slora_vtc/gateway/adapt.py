"""A concurrency budget adapted from an upstream's own queue (vLLM's /metrics): AIMD.

vLLM exports `vllm:num_requests_waiting` and `vllm:num_requests_running` (gauges, one sample per
model / engine). While the upstream queues nothing and the gateway uses its whole budget, the
budget grows by one slot per probe; as soon as the upstream queues, it shrinks by a quarter. So the
gateway keeps just enough in flight to fill the upstream's batch, and the rest waits here, in the
fair queues, instead of in the upstream's FCFS queue.
"""

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"


@dataclass(frozen=True)
class Aimd:
    start: int = 8
    floor: int = 1
    ceiling: int = 1024
    increase: int = 1
    decrease: float = 0.75  # the budget kept when the upstream queues

    def next_limit(self, limit: int, upstream_waiting: float, inflight: int) -> int:
        if upstream_waiting > 0:
            return max(self.floor, math.floor(limit * self.decrease))
        if inflight >= limit:
            return min(self.ceiling, limit + self.increase)
        return limit


def queue_metrics(text: str) -> tuple[float, float] | None:
    """(waiting, running) summed over every sample of vLLM's two gauges; None if the page has neither."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (WAITING, RUNNING):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError:  # not the Prometheus text format
        return None
    if WAITING not in totals:
        return None
    return totals[WAITING], totals.get(RUNNING, 0.0)
