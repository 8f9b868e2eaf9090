"""Which arrivals a full queue refuses, fairly: up to `bound` waiting requests every client is taken;
beyond, only a client holding less than its even share of the bound (split over the waiting clients,
itself included), so one flooding client cannot lock the others out; at twice the bound everyone
is refused, so the queue never holds more than that."""

from slora_vtc.sched.base import Scheduler


def queue_refuses(scheduler: Scheduler, client: str, bound: int | None) -> bool:
    """Whether `client`'s next request is refused by a queue of at most about `bound` waiting (None: no bound)."""
    if bound is None:
        return False
    waiting = scheduler.num_waiting()
    if waiting < bound:
        return False
    if waiting >= 2 * bound:
        return True
    by_client = scheduler.waiting_by_client()
    share = bound / (len(by_client) + (client not in by_client))
    return by_client.get(client, 0) >= share
