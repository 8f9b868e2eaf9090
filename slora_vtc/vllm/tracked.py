"""What the plugin keeps for each request vLLM hands it, from `add_request` to its end: our Request
mirroring it (what our schedulers see: tenant, prompt length, arrival, tokens generated) and what
its prompt was charged so far. Nothing here imports vllm: a vLLM request is only read."""

from dataclasses import dataclass
from enum import Enum

from slora_vtc.request import Request
from slora_vtc.sched.prompt_charge import PromptProgress
from slora_vtc.vllm.tenant import tenant_of


class Where(str, Enum):
    WAITING = "waiting"  # in one of vLLM's waiting queues (ours)
    RUNNING = "running"  # in vLLM's running list
    GONE = "gone"  # taken out for good (removed, rejected): nothing more is reported for it


@dataclass(eq=False)
class Tracked:
    vreq: object  # vllm.v1.request.Request
    mirror: Request
    where: Where = Where.WAITING
    admitting: bool = False  # popped from a waiting queue during this schedule()
    prompt: PromptProgress | None = None  # its prompt's charges so far, from its first admission (None: not yet)
    free_token: bool = False  # its next delivered token is a prefill's, charged with that prefill

    @property
    def tenant(self) -> str:
        return self.mirror.client


class Requests:
    """The tracked requests, by vLLM's request id and by our rid."""

    def __init__(self):
        self.by_id: dict[str, Tracked] = {}
        self.by_rid: dict[int, Tracked] = {}
        self._next_rid = 0

    def track(self, vreq, now: float) -> Tracked:
        mirror = Request(
            client=tenant_of(vreq),
            prompt_len=vreq.num_prompt_tokens,
            max_new_tokens=vreq.max_tokens,
            arrival=now,
            rid=self._next_rid,
            prompt_ids=vreq.prompt_token_ids,
        )
        self._next_rid += 1
        tracked = self.by_id[vreq.request_id] = self.by_rid[mirror.rid] = Tracked(vreq, mirror)
        return tracked

    def get(self, request_id: str) -> Tracked | None:
        return self.by_id.get(request_id)

    def of(self, mirror: Request) -> Tracked:
        return self.by_rid[mirror.rid]

    def drop(self, tracked: Tracked) -> None:
        self.by_id.pop(tracked.vreq.request_id, None)
        self.by_rid.pop(tracked.mirror.rid, None)

    def __len__(self) -> int:
        return len(self.by_id)

    def running_by_tenant(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.by_id.values():
            if t.where is Where.RUNNING:
                counts[t.tenant] = counts.get(t.tenant, 0) + 1
        return counts
