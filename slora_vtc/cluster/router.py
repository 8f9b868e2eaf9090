"""The router interface: where each new request goes, and what it learns when one ends."""

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from slora_vtc.engine import Engine
from slora_vtc.request import Request
from slora_vtc.sched.base import Scheduler

NewScheduler = Callable[[], Scheduler]  # builds one scheduler from the run's --scheduler spec
AdmitHook = Callable[[Request, int], None]  # a pulled request was admitted by replica i


@dataclass(frozen=True)
class RouterOptions:
    """Settings shared by every router of a run."""

    clients: tuple[str, ...] = ()  # the workload's clients, in order
    seed: int = 42
    routers: int = 1  # global-vtc: router instances, each with its own queues and counters
    sync_s: float | None = None  # global-vtc with several routers: counters made cluster-wide every S s (None: never)
    ingress_skew: float = 0.0  # global-vtc with several routers: share of a client's requests sent to its home router


class Router(ABC):
    """Sends each arriving request to a replica (push), or keeps it for the replicas to pull.

    A push router's replicas each run their own scheduler, built from the run's spec. A pull
    router (`pulls = True`) gives every replica a view of its own queue instead
    (`schedulers`); `route` then only names the replica whose admission check the request
    must pass (it never runs there unless that replica pulls it).
    """

    pulls = False
    stateless = False  # True: `route` depends on the requests alone (never on the replicas' state), so it may run ahead
    instances = False  # True: `--routers K` runs K instances of it, each with its own counters (global-vtc)

    def schedulers(self, n: int, new_scheduler: NewScheduler, on_admit: AdmitHook) -> list[Scheduler]:
        """Each replica's scheduler: by default its own."""
        return [new_scheduler() for _ in range(n)]

    @abstractmethod
    def route(self, req: Request, engines: list[Engine]) -> int:
        """The replica the request goes to."""

    def next_own_event(self) -> float:
        """When the router next changes something by itself, not called by a replica (global VTC's
        routers synchronise their counters): no replica's macro-step runs past it, as the steps that
        start after it see what it changes."""
        return math.inf

    def on_end(self, req: Request, replica: int) -> None:  # noqa: B027 (a hook: most routers learn nothing)
        """A request routed to `replica` ended (finished, rejected or aborted); -1: it never reached one."""


def largest_pool(engines: list[Engine]) -> int:
    """The replica with the largest pool (the first of those): the one any request fits best."""
    return max(range(len(engines)), key=lambda i: (engines[i].config.pool_tokens, -i))
