"""The scheduler tests' helpers: a scheduler that serves nothing, a fake admission budget, requests
by shape, arrivals, and named token segments."""

import math

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request, State
from slora_vtc.sched.base import Scheduler


class Plain(Scheduler):
    """A scheduler without preemption hooks (it serves nothing)."""

    def on_arrival(self, req, now):
        return True

    def peek(self, budget):
        return None

    def pop(self, req, now):
        raise AssertionError("nothing to pop")

    def remove(self, req):
        return False

    def num_waiting(self):
        return 0

    def drain(self):
        return []


class FakeBudget(AdmissionBudget):
    """A budget driven by dicts: `cached[rid]` cached tokens; `room` tokens to admit into (each
    request takes its extend tokens, prefill_len - cached); `offered` records every try_add."""

    def __init__(self, cached: dict[int, int] | None = None, room: float = math.inf):
        self.cached = cached or {}
        self.room = room
        self.offered: list[int] = []
        self.asked: list[int] = []

    def cached_len(self, r: Request) -> int:
        self.asked.append(r.rid)
        return self.cached.get(r.rid, 0)

    def try_add(self, r: Request) -> bool:
        self.offered.append(r.rid)
        need = r.prefill_len - self.cached.get(r.rid, 0)
        if need > self.room:
            return False
        self.room -= need
        return True


def reqs(*shapes):
    """Requests (client, prompt, output) numbered 0, 1, ... in arrival order."""
    return [Request(c, p, o, float(i), rid=i) for i, (c, p, o) in enumerate(shapes)]


def arrive(sched, *requests: Request, now: float | None = None) -> None:
    """Each request arrives (at `now`, or else at its own arrival time) and is accepted."""
    for r in requests:
        assert sched.on_arrival(r, r.arrival if now is None else now)


def rids(requests):
    return [r.rid for r in requests]


def run_token(*requests):
    """What the engine's prefill or decode does to a request: one more token."""
    for r in requests:
        r.state = State.RUNNING
        r.append_token(None, 0.0)


def ids(client: int, segment: int, length: int) -> list[int]:
    """Token ids of one named segment: the same (client, segment) always gives the same ids, and
    no two segments share one (so prefixes are shared exactly where a test means them to be)."""
    return [(client * 1000 + segment) * 10_000 + k for k in range(length)]
