"""D2LPM's router (Algorithm 2 of arXiv 2501.14312): global per-(client, replica) deficits with
a quantum Q_w, and a global index of which replicas hold which prefixes. Each replica runs DLPM
itself (`--scheduler dlpm:Q_u`); the router only decides where a request goes.

Dispatch: G = the replicas holding the longest prefix match of the request (every replica when
none matches); A = the replicas where the client has credit (q > 0), refilled by +Q_w on every
replica while there is none; the request goes to the replica with the fewest outstanding
requests in G and A, or in A when they do not meet. It is charged w_e * its whole prompt there
at once, and w_q * its output tokens when it ends.

What the paper leaves open, decided (each with its reason):
- The prefix index records where the router sent each prefix, in blocks of BLOCK tokens (a
  prefix matches a replica when all its blocks were sent there): it is the router's own view, as
  the paper's global tree is. Evictions never reach it (the paper makes them asynchronous):
  a long run may route to a replica that has evicted the prefix, and the index grows with the
  distinct prefixes seen.
- Refill: the k rounds of +Q_w that give some replica credit are added at once to every
  replica's deficit of that client (the paper's "add Q_w to every q_{i,w}" repeated k times).
- A request without token ids matches every replica equally: G is every replica.
- Outstanding requests s_w count what was routed there and has not ended (waiting or running).
- Ties go to the lowest replica index.
"""

import numpy as np

from slora_vtc.cluster.router import Router
from slora_vtc.engine import Engine
from slora_vtc.request import Request
from slora_vtc.sched.dlpm import W_EXTEND, W_OUTPUT

BLOCK = 16  # tokens per entry of the prefix index


def block_hashes(ids) -> list[int]:
    """Chained hashes of the prompt's whole blocks: entry k stands for its first (k + 1) * BLOCK tokens."""
    hashes, h = [], 0
    for start in range(0, len(ids) - BLOCK + 1, BLOCK):
        h = hash((h, *ids[start : start + BLOCK]))
        hashes.append(h)
    return hashes


def token_list(ids) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


class D2LPM(Router):
    """Deficit-gated prefix routing (module docstring: the algorithm and the decisions)."""

    def __init__(self, quantum: float, w_e: float = W_EXTEND, w_q: float = W_OUTPUT):
        self.quantum = quantum
        self.w_e, self.w_q = w_e, w_q
        self._deficit: dict[str, np.ndarray] = {}
        self._outstanding: np.ndarray | None = None
        self._holders: dict[int, int] = {}  # block hash -> bit mask of the replicas it was sent to
        self.refills = 0

    def route(self, req: Request, engines: list[Engine]) -> int:
        n = len(engines)
        if self._outstanding is None:
            self._outstanding = np.zeros(n, dtype=np.int64)
        q = self._deficit.setdefault(req.client, np.zeros(n))
        hashes = block_hashes(token_list(req.prompt_ids)) if req.prompt_ids is not None else []
        holders = self._longest_match(hashes, n)
        credit = self._credit(q)
        both = holders & credit
        i = self._least_outstanding(both if both.any() else credit)
        q[i] -= self.w_e * req.prompt_len
        self._outstanding[i] += 1
        for h in hashes:
            self._holders[h] = self._holders.get(h, 0) | (1 << i)
        return i

    def _longest_match(self, hashes: list[int], n: int) -> np.ndarray:
        mask = (1 << n) - 1
        for h in hashes:
            deeper = mask & self._holders.get(h, 0)
            if not deeper:
                break
            mask = deeper
        return np.array([(mask >> i) & 1 for i in range(n)], dtype=bool)

    def _credit(self, q: np.ndarray) -> np.ndarray:
        if not (q > 0).any():
            rounds = int(np.floor(-q.max() / self.quantum)) + 1
            q += rounds * self.quantum
            self.refills += rounds
        return q > 0

    def _least_outstanding(self, allowed: np.ndarray) -> int:
        return int(np.argmin(np.where(allowed, self._outstanding, np.iinfo(np.int64).max)))

    def on_end(self, req: Request, replica: int) -> None:
        if replica < 0:
            return
        self._deficit[req.client][replica] -= self.w_q * req.generated
        self._outstanding[replica] -= 1

    def deficits(self, client: str) -> list[float]:
        return self._deficit[client].tolist() if client in self._deficit else []
