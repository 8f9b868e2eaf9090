"""vLLM's two waiting queues, ordered by our scheduler.

`FairQueue` replaces `Scheduler.waiting`: a vLLM `RequestQueue` over our `PeekPopQueue`, so that
vLLM's waiting loop (peek, decide, pop) admits in our scheduler's order. vLLM prepends a request in
two cases, both handled as our `on_preempt` (it waits again, ahead of what arrived after it): a
preempted request, and one its loop popped but could not start yet (it puts those back at the end of
the loop).

`HoldingQueue` replaces `Scheduler.kv_holding_waiting`, the requests that wait while holding KV
blocks (remote KV loads, streaming sessions), which vLLM drains first: least counter first (arrival
order for a scheduler without counters). A request that arrives there is still announced to the
scheduler (`on_arrival`: the lift, a rate limit) and then taken out of its queue.

A request the scheduler refuses at arrival (a rate limit) is handed to `on_reject`.
"""

from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.sched import Scheduler
from slora_vtc.sched.queue import PeekPopQueue
from slora_vtc.vllm.tracked import Requests, Tracked, Where


class CachedLen(AdmissionBudget):
    """What vLLM's prefix cache holds of a waiting request (for lpm and dlpm); a new one per step, as
    those schedulers decide their order once per round. Room is vLLM's to check: it never refuses."""

    def __init__(self, kv_cache_manager, requests: Requests):
        self.kv_cache_manager, self.requests = kv_cache_manager, requests

    def try_add(self, req) -> bool:
        return True

    def cached_len(self, req) -> int:
        vreq = self.requests.of(req).vreq
        if vreq.num_computed_tokens:  # it holds blocks already
            return vreq.num_computed_tokens
        return self.kv_cache_manager.get_computed_blocks(vreq)[1]


class Members:
    """The tracked requests one queue holds, in the order they came in."""

    def __init__(self):
        self._tracked: dict[int, Tracked] = {}

    def add(self, t: Tracked) -> None:
        self._tracked[t.mirror.rid] = t
        t.where = Where.WAITING

    def take(self, t: Tracked) -> bool:
        return self._tracked.pop(t.mirror.rid, None) is not None

    def __contains__(self, t: Tracked) -> bool:
        return t.mirror.rid in self._tracked

    def __len__(self) -> int:
        return len(self._tracked)

    def __iter__(self) -> Iterator[Tracked]:
        return iter(list(self._tracked.values()))


class TrackedQueue(RequestQueue):
    """What both queues share: tracking requests as they come in, and vLLM's bulk calls."""

    def __init__(self, scheduler: Scheduler, requests: Requests, now: Callable[[], float],
                 on_reject: Callable[[Tracked], None]):  # fmt: skip
        self.scheduler, self.requests, self.now, self.on_reject = scheduler, requests, now, on_reject
        self.members = Members()

    def add_request(self, request) -> None:
        known = self.requests.get(request.request_id)
        if known is not None:  # back to waiting (a streaming session's next input, a finished KV load)
            self.prepend_request(request)
            return
        tracked = self.requests.track(request, self.now())
        if self._arrive(tracked):
            self.members.add(tracked)
        else:
            tracked.where = Where.GONE
            self.on_reject(tracked)

    def prepend_requests(self, requests: Iterable) -> None:
        for request in requests:
            self.prepend_request(request)

    def remove_requests(self, requests: Iterable) -> None:
        for request in requests:
            self.remove_request(request)

    def _back(self, request) -> Tracked:
        """A request vLLM puts back at the head (preempted, or skipped this step): a member again,
        with the tokens it has so far, no longer being admitted."""
        tracked = self.requests.get(request.request_id)
        tracked.mirror.generated = request.num_output_tokens
        tracked.admitting = False
        self.members.add(tracked)
        return tracked

    def _mine(self, request) -> Tracked | None:
        tracked = self.requests.get(request.request_id)
        return tracked if tracked is not None and tracked in self.members else None

    def __len__(self) -> int:
        return len(self.members)

    def __bool__(self) -> bool:
        return len(self.members) > 0

    def __iter__(self) -> Iterator:
        return (t.vreq for t in self.members)


class FairQueue(TrackedQueue):
    """`Scheduler.waiting`, in our scheduler's order (module docstring)."""

    def __init__(self, scheduler, requests, now, on_reject):
        super().__init__(scheduler, requests, now, on_reject)
        self.peek_pop = PeekPopQueue(scheduler, now)

    def new_step(self, budget: AdmissionBudget) -> None:
        self.peek_pop.budget = budget

    def _arrive(self, tracked: Tracked) -> bool:
        return self.peek_pop.add_request(tracked.mirror)

    def peek_request(self):
        return self.requests.of(self.peek_pop.peek_request()).vreq

    def pop_request(self):
        tracked = self.requests.of(self.peek_pop.pop_request())
        self.members.take(tracked)
        tracked.where, tracked.admitting = Where.RUNNING, True
        return tracked.vreq

    def prepend_request(self, request) -> None:
        self.peek_pop.prepend_request(self._back(request).mirror)

    def remove_request(self, request) -> None:
        tracked = self._mine(request)
        if tracked is None:
            return
        # our schedulers settle a waiting request that was admitted before (a preempted one) by its
        # tokens; one preempted before its first token was admitted too (its prompt was charged)
        admitted = tracked.prompt is not None and tracked.prompt.charge is not None
        tracked.mirror.generated = max(request.num_output_tokens, int(admitted))
        self.peek_pop.remove_request(tracked.mirror)
        self.members.take(tracked)
        tracked.where = Where.GONE


class HoldingQueue(TrackedQueue):
    """`Scheduler.kv_holding_waiting`: least counter first (module docstring)."""

    def _arrive(self, tracked: Tracked) -> bool:
        if not self.scheduler.on_arrival(tracked.mirror, tracked.mirror.arrival):
            return False
        self.scheduler.remove(tracked.mirror)
        return True

    def _head(self) -> Tracked:
        if not self.members:
            raise IndexError("peek from an empty queue")
        ledger = self.scheduler.traits.ledger
        return min(self.members, key=lambda t: (self.scheduler.counter_of(t.tenant) if ledger else 0.0, t.mirror.rid))

    def peek_request(self):
        return self._head().vreq

    def pop_request(self):
        tracked = self._head()
        self.members.take(tracked)
        tracked.where, tracked.admitting = Where.RUNNING, True
        return tracked.vreq

    def prepend_request(self, request) -> None:
        self._back(request)

    def remove_request(self, request) -> None:
        tracked = self._mine(request)
        if tracked is not None:
            self.members.take(tracked)
            tracked.where = Where.GONE
