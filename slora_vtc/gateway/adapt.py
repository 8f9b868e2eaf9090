"""A concurrency budget adapted from an upstream's own queue (vLLM's /metrics): AIMD around a margin.

vLLM exports `vllm:num_requests_waiting` and `vllm:num_requests_running` (gauges, one sample per
model / engine). The budget aims at an upstream that runs its full batch with a margin queued
behind it (`margin` per request of the batch, at least `min_margin`: one request for a batch of 4,
64 for vLLM's default of 256): when a request ends, its successor is already there and joins the
batch at the next step, instead of after the gateway has seen the end, dispatched, and the
upstream has parsed and tokenized a new request. The batch is the most requests the upstream was
seen running (`Upstream.batch`), not the count of the moment: requests of equal length end
together, and a probe that lands then sees an empty batch and a full queue.

While the upstream queues less than the margin and the gateway uses its whole budget, the budget
grows by one slot per probe; when it queues more, the budget shrinks by a quarter, but never below
the batch plus the margin. Measured on vLLM (benchmarks/gateway_vllm.py, docs/gateway.md): the old
rule, which cut the budget by a quarter whenever the upstream queued anything, kept it below the
batch; a margin of a whole batch kept the batch fuller but let vLLM's FCFS queue decide again (a
tenant with 4 requests in flight got 0.40 of the service of one with 12, against 0.83 with the old
rule). The backlog beyond the margin waits here, in the fair queues.
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
    margin: float = 0.25  # requests kept queued upstream per request of its batch, to refill it as requests end
    min_margin: int = 1

    def margin_for(self, batch: float) -> int:
        return max(self.min_margin, math.ceil(batch * self.margin))

    def next_limit(self, limit: int, upstream_waiting: float, inflight: int, batch: float = 0.0) -> int:
        """The next budget, from the upstream's queue and `batch`, the most requests it was seen running."""
        margin = self.margin_for(batch)
        if upstream_waiting > margin:
            keep = max(math.ceil(batch) + margin, math.floor(limit * self.decrease))
            return max(self.floor, min(limit, keep))
        if upstream_waiting < margin and inflight >= limit:
            return min(self.ceiling, limit + self.increase)
        return limit


def queue_metrics(text: str) -> tuple[float, float] | None:
    """(waiting, running) summed over every sample of vLLM's two gauges; None if the page has neither."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(_gauge_lines(text)):
            for sample in family.samples:  # only the two gauges' samples are left (_gauge_lines)
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError:  # not the Prometheus text format
        return None
    if WAITING not in totals:
        return None
    return totals[WAITING], totals.get(RUNNING, 0.0)


def _gauge_lines(text: str) -> str:
    """The lines of `text` about the two gauges (their samples, HELP and TYPE), for the parser: vLLM's
    page holds dozens of histograms besides, and parsing all of it twice a second was a tenth of the
    gateway's CPU under load (py-spy, benchmarks/gateway_vllm.py)."""
    return "".join(line for line in text.splitlines(keepends=True) if _names_a_gauge(line))


def _names_a_gauge(line: str) -> bool:
    words = line.split(maxsplit=3)
    if line.startswith("#"):
        return len(words) > 2 and words[1] in ("HELP", "TYPE") and words[2] in (WAITING, RUNNING)
    return bool(words) and words[0].partition("{")[0] in (WAITING, RUNNING)
