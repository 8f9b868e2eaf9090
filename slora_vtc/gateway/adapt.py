"""A concurrency budget adapted from an upstream's own queue (vLLM's /metrics): AIMD around a margin.

vLLM exports `vllm:num_requests_waiting` and `vllm:num_requests_running` (gauges, one sample per
model / engine). The budget aims at an upstream that runs a full batch with `margin` requests queued
behind it: when one of its requests ends, the next one is already there and joins the batch at its
next step, instead of after the gateway has seen the end, dispatched, and the upstream has parsed and
tokenized a new request (measured on vLLM: a budget of exactly the batch left holes in it, and one cut
below the batch by a momentary queue left more; benchmarks/gateway_vllm.py). While the upstream queues
fewer than `margin` and the gateway uses its whole budget, the budget grows by one slot per probe;
when it queues more, the budget shrinks by a quarter, but never below what the upstream runs plus the
margin. So the backlog still waits here, in the fair queues, and only `margin` requests wait in the
upstream's FCFS queue.
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
    decrease: float = 0.75  # the budget kept when the upstream queues more than the margin
    margin: int = 1  # requests kept queued upstream, ready to fill its batch as soon as a request ends

    def next_limit(self, limit: int, upstream_waiting: float, inflight: int, upstream_running: float = 0.0) -> int:
        if upstream_waiting > self.margin:
            keep = max(math.ceil(upstream_running) + self.margin, math.floor(limit * self.decrease))
            return max(self.floor, min(limit, keep))
        if upstream_waiting < self.margin and inflight >= limit:
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
