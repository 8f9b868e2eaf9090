"""The upstream servers and their in-flight slots: who has room, who is down, what failed."""

from dataclasses import dataclass


@dataclass(eq=False)
class Upstream:
    """One OpenAI-compatible server. `limit` is its concurrency budget (fixed, or adapted when
    `adaptive`); `up` turns False on a connection failure and True again when a probe answers."""

    url: str
    limit: int
    adaptive: bool = False
    inflight: int = 0
    up: bool = True
    finished: int = 0
    errors: int = 0  # failed connections, broken streams, 5xx answers
    timeouts: int = 0
    queued_upstream: float = 0.0  # vllm:num_requests_waiting at the last probe (adaptive only)
    batch: float = 0.0  # the most requests it was seen running (vllm:num_requests_running; adaptive only)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.inflight) if self.up else 0


class UpstreamPool:
    """The upstreams, in the order given; a request goes to the one with the most free slots."""

    def __init__(self, upstreams: list[Upstream]):
        self.upstreams = upstreams

    def best(self) -> Upstream | None:
        """The upstream with the most free slots (the first such, on a tie); None if none has one."""
        best = max(self.upstreams, key=lambda u: u.free)
        return best if best.free > 0 else None

    def acquire(self, upstream: Upstream) -> None:
        upstream.inflight += 1

    def release(self, upstream: Upstream) -> None:
        upstream.inflight -= 1

    @property
    def any_up(self) -> bool:
        return any(u.up for u in self.upstreams)

    @property
    def inflight(self) -> int:
        return sum(u.inflight for u in self.upstreams)
