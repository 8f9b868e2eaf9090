"""Prefix affinity: consistent hashing of the request's prefix, so that requests sharing it meet
the same replica's prefix cache."""

import hashlib
from bisect import bisect_right

from slora_vtc.cluster.router import Router
from slora_vtc.engine import Engine
from slora_vtc.request import Request

POINTS_PER_REPLICA = 100  # virtual nodes on the ring: spreads keys evenly, moves 1/N of them when N changes


def stable_hash(data: bytes) -> int:
    """A hash that is the same in every process (Python's str hash is salted per process)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class PrefixAffinity(Router):
    """Each request to the replica owning the hash of its first `prefix_tokens` token ids on a
    consistent-hash ring; a request without ids hashes its client instead. Tokens the serving
    path added (a BOS) are left out: every prompt starts with them."""

    stateless = True

    def __init__(self, prefix_tokens: int = 64):
        self.prefix_tokens = prefix_tokens
        self._ring: list[int] = []
        self._owner: list[int] = []

    def _build(self, n: int) -> None:
        points = sorted(
            (stable_hash(f"replica-{i}-{v}".encode()), i) for i in range(n) for v in range(POINTS_PER_REPLICA)
        )
        self._ring = [p for p, _ in points]
        self._owner = [i for _, i in points]

    def key(self, req: Request) -> int:
        if req.prompt_ids is None:
            return stable_hash(req.client.encode())
        prefix = req.prompt_ids[req.added_tokens : req.added_tokens + self.prefix_tokens]
        import numpy as np  # only with token ids

        return stable_hash(np.asarray(prefix, dtype=np.int64).tobytes())

    def route(self, req: Request, engines: list[Engine]) -> int:
        if not self._ring:
            self._build(len(engines))
        pos = bisect_right(self._ring, self.key(req)) % len(self._ring)
        return self._owner[pos]
