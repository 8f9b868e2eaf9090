"""Per tenant: the scheduler's counter, what the plugin charged, requests waiting and running, tokens,
requests by outcome; and the plugin's time per step. Logged as one line every `log_interval_s` while
vLLM works, and written as JSON to `stats_file` (replaced atomically) at the same times and whenever
vLLM falls idle, so that the file always ends with the final numbers.

vLLM's scheduler runs in its engine-core process, whose /metrics vLLM does not serve (the API server
serves its own), so this file and the log are the plugin's exports.
"""

import json
import os
from collections import defaultdict
from pathlib import Path

from slora_vtc.sched import Scheduler

FIELDS = ("charged", "prompt_tokens", "cached_tokens", "output_tokens", "finished", "aborted", "failed",
          "rejected", "preempted")  # fmt: skip
MAX_VICTIMS = 100


class TenantStats:
    def __init__(self, spec: str, interval_s: float, stats_file: str | None):
        self.spec, self.interval_s = spec, interval_s
        self.path = Path(stats_file) if stats_file else None
        self.tenants: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(FIELDS, 0))
        self.steps = 0
        self.schedule_s = 0.0  # time in schedule(), vLLM's and ours
        self.plugin_s = 0.0  # of which the plugin's own steps around vLLM's (ordering, charging)
        self.update_s = 0.0  # the plugin's time in update_from_output
        self.victims: list[dict] = []  # the latest preemptions: the victim's tenant, its counter, the largest
        self._due = 0.0

    # -- counting ----------------------------------------------------------------------------------
    def charge(self, tenant: str, amount: float) -> None:
        if amount:
            self.tenants[tenant]["charged"] += amount

    def computed(self, tenant: str, tokens: int) -> None:
        self.tenants[tenant]["prompt_tokens"] += tokens

    def cached(self, tenant: str, tokens: int) -> None:
        self.tenants[tenant]["cached_tokens"] += tokens

    def produced(self, tenant: str, tokens: int) -> None:
        self.tenants[tenant]["output_tokens"] += tokens

    def ended(self, tenant: str, outcome: str) -> None:
        self.tenants[tenant][outcome] += 1

    def preempted(self, tenant: str, counter: float | None, largest_kept: float | None) -> None:
        """A request of `tenant` was preempted, its counter `counter` when the step began; `largest_kept`:
        the largest counter then among the tenants that kept a request running (None: none did)."""
        self.tenants[tenant]["preempted"] += 1
        victim = {"tenant": tenant, "counter": counter, "largest_kept": largest_kept}
        self.victims = [*self.victims[-(MAX_VICTIMS - 1) :], victim]

    def step(self, schedule_s: float, plugin_s: float) -> None:
        self.steps += 1
        self.schedule_s += schedule_s
        self.plugin_s += plugin_s

    # -- reporting ---------------------------------------------------------------------------------
    def snapshot(self, scheduler: Scheduler, running: dict[str, int], tracked: int) -> dict:
        waiting = scheduler.waiting_by_client()
        counters = scheduler.counters() if scheduler.traits.ledger else {}
        names = set(self.tenants) | set(waiting) | set(running) | set(counters)
        tenants = {
            name: {
                "counter": counters.get(name, 0.0),
                "weight": scheduler.weight_of(name) if scheduler.traits.ledger else 1.0,
                "waiting": waiting.get(name, 0),
                "running": running.get(name, 0),
                **self.tenants[name],
            }
            for name in sorted(names)
        }
        per_step = 1e3 / self.steps if self.steps else 0.0
        return {
            "scheduler": self.spec,
            "steps": self.steps,
            "schedule_ms_per_step": self.schedule_s * per_step,
            "plugin_ms_per_step": (self.plugin_s + self.update_s) * per_step,
            "tracked": tracked,
            "tenants": tenants,
            "victims": self.victims,
        }

    def due(self, now: float) -> bool:
        return now >= self._due

    def report(self, now: float, snapshot: dict, log) -> None:
        self._due = now + self.interval_s
        parts = [
            f"{name} counter={t['counter']:.0f} waiting={t['waiting']} running={t['running']}"
            for name, t in snapshot["tenants"].items()
        ]
        log.info("slora_vtc %s: %s", self.spec, "; ".join(parts) or "no tenants")
        self.write(snapshot)

    def write(self, snapshot: dict) -> None:
        if self.path is None:
            return
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(snapshot, indent=1))
        os.replace(partial, self.path)
