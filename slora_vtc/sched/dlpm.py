"""Deficit longest prefix match (DLPM, Algorithm 1 of arXiv 2501.14312): LPM order, gated by
per-client deficits refilled by a quantum Q, so that locality is kept within a bounded unfairness.

Service W = w_e * extend tokens + w_q * output tokens (w_e = 1, w_q = 2, the paper's, whatever
--cost is). A client may admit only while its deficit q > 0; admitting charges q -= w_e * extend,
each output token charges q -= w_q; when no client with a waiting request has q > 0, every active
client with q <= 0 gets +Q. Hence -U < q <= Q, U = w_e * L_input + w_q * M (L_input: the largest
input of a request, M: the most output tokens of one client's requests running at once), and two
backlogged clients stay within 2 (U + Q) of each other in W (Thm 4.1).

What the paper leaves open, decided (each with its reason):
- Idle clients: a client with nothing waiting or running leaves the refill set, keeping
  min(q, 0): credit saved while idle is not spent later (as VTC's lift), and pausing does not
  clear a debt. A client seen for the first time starts at 0. So forgetting an idle client
  (`forget`) drops it where q = 0 (it would start at 0 again) and keeps only a debt.
- Refill: repeated until a client with a waiting request has credit, since one +Q may not lift
  a debt of up to U > Q; never above Q, because only clients at q <= 0 get it.
- Loop termination: the pass stops at the first request with credit that does not fit (the
  budget is spent; head-of-line as every scheduler here) or when all were seen. After a mid-pass
  refill it scans again from the top, so a refilled client's longer match is not passed over;
  each scan admits a request or stops, so a round ends.
- extend_len: prefill_len - budget.cached_len(req), measured at admission (there is no chunked
  prefill). Two requests of one prefill batch sharing an uncached prefix both pay for it: the
  cache takes a prefix only after its prefill, so both compute it.
- Prefixes across clients: shared only under one adapter; where clients share one, whoever
  computes it first pays (it is measured at admission) and later hits are free.
- Output tokens: the prefill's token is charged w_q at admission and each decode token before its
  step, so the charges are exactly W (leaving the first token free, as VTC does, would let W
  drift from the charges by w_q per request and void the bound).
- Preemption: the victim is the latest arrival of the running client with the lowest deficit (the
  most served lately). It waits again in arrival order and is readmitted through the deficit
  gate; its second prefill's token is charged w_q (unless its interrupted decode step already
  was), its recomputed K/V w_e each only with charge_recompute.
- Cached prompt tokens are free (Alg. 1); VTC's charge_cached does not apply here.
- The quantum has no default: the paper does not give the Q of its main results (its Fig. 1
  sweeps 1k to 32k), so a spec names it (`dlpm:8000`).
- D2LPM (several replicas, Alg. 2) is not here: the engine is one replica.
"""

import math
from collections import Counter

from slora_vtc.memory.budget import AdmissionBudget
from slora_vtc.request import Request
from slora_vtc.sched.base import Traits, arrival_key, recomputed_tokens, victims_one_by_one
from slora_vtc.sched.ledger import Ledger
from slora_vtc.sched.lpm import LPM

W_EXTEND, W_OUTPUT = 1.0, 2.0


class DLPM(LPM, Ledger):
    """LPM order, admission gated by per-client deficits (module docstring: the algorithm and
    every decision on what the paper leaves open). Its ledger's counters are the deficits."""

    traits = Traits(needs_token_ids=True, ledger=True, preemption=True, lookahead=True)

    def __init__(self, quantum: float, w_e: float = W_EXTEND, w_q: float = W_OUTPUT, charge_recompute: bool = False):
        self.quantum = quantum
        self.w_e, self.w_q = w_e, w_q
        self.charge_recompute = charge_recompute
        super().__init__()  # the waiting requests in arrival order, ranked by longest prefix each round
        self.refills = 0  # rounds of +Q handed out
        self._deficit: dict[str, float] = {}
        self._waiting: Counter[str] = Counter()
        self._running: Counter[str] = Counter()
        self._charged: dict[int, int] = {}  # rid -> highest token number charged, while it runs or is preempted

    # -- deficits (the ledger) ----------------------------------------------------------------------
    def deficits(self) -> dict[str, float]:
        """Every client's deficit q (a copy)."""
        return dict(self._deficit)

    def counters(self) -> dict[str, float]:
        return self.deficits()

    def counter_of(self, client: str) -> float:
        return self._deficit.get(client, 0.0)

    def adjust(self, client: str, delta: float) -> None:
        """Service `delta` more (or less, negative) than charged: the deficit falls by it."""
        self._deficit[client] = self._deficit.get(client, 0.0) - delta

    def set_counter(self, client: str, value: float) -> None:
        self._deficit[client] = value

    def forget(self, client: str, now: float) -> bool:
        if self._active(client):
            return False
        self._waiting.pop(client, None)
        self._running.pop(client, None)
        if self._deficit.get(client) == 0:
            del self._deficit[client]
        return True  # an idle debt never changes: nothing more to drop later

    def _active(self, client: str) -> bool:
        return self._waiting[client] + self._running[client] > 0

    def _stalled(self) -> bool:
        """Some client has a request waiting, and none of those has credit."""
        waiting = [client for client, n in self._waiting.items() if n]
        return bool(waiting) and not any(self._deficit[client] > 0 for client in waiting)

    def _refill_while_stalled(self) -> bool:
        """Hand out +Q to every active client at q <= 0, again and again until a waiting client
        has credit; the k rounds that takes are added at once (a small Q would loop long).
        Whether it handed out any."""
        refilled = False
        while self._stalled():
            k = min(self._rounds_to_credit(self._deficit[c]) for c, n in self._waiting.items() if n)
            for client, q in self._deficit.items():
                if q <= 0 and self._active(client):
                    self._deficit[client] = q + min(k, self._rounds_to_credit(q)) * self.quantum
            self.refills += k
            refilled = True
        return refilled

    def _rounds_to_credit(self, q: float) -> int:
        """Refills that take a deficit q <= 0 above 0 (each stops once it is)."""
        return math.floor(-q / self.quantum) + 1

    def _leave_if_idle(self, client: str) -> None:
        if not self._active(client):
            self._deficit[client] = min(self._deficit[client], 0.0)

    # -- the queue ----------------------------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> bool:
        self._deficit.setdefault(req.client, 0.0)
        self._waiting[req.client] += 1
        return super().on_arrival(req, now)

    def peek(self, budget: AdmissionBudget) -> Request | None:
        """The first request, in this round's longest-prefix order, whose client has credit. Those
        before the cursor had none, and deficits only fall until a refill, which rescans from the top."""
        r = self.round(budget)
        if self._refill_while_stalled():
            r.cursor = 0
        for i, req, _ in r.candidates():
            if self._deficit[req.client] > 0:
                r.cursor = i
                return req
        return None

    def pop(self, req: Request, now: float) -> None:
        super().pop(req, now)
        self._waiting[req.client] -= 1
        self._running[req.client] += 1

    def remove(self, req: Request) -> bool:
        if not super().remove(req):
            return False
        self._end_waiting(req)
        return True

    def drain(self) -> list[Request]:
        drained = super().drain()
        for req in drained:
            self._end_waiting(req)
        return drained

    def _end_waiting(self, req: Request) -> None:
        self._charged.pop(req.rid, None)  # preempted (in mid-prompt too): forget what was kept for it
        self._waiting[req.client] -= 1
        self._leave_if_idle(req.client)

    def waiting_by_client(self) -> dict[str, int]:
        return {client: n for client, n in self._waiting.items() if n}

    # -- charging -----------------------------------------------------------------------------------
    def on_prefill(self, req: Request, computed: int, cached: int, now: float) -> float:
        before = self._deficit[req.client]
        if not req.generated:  # a first prefill: its extend tokens and the token it yields
            self._deficit[req.client] -= self.w_e * computed + self.w_q
            self._charged[req.rid] = 1
        else:
            if self._charged[req.rid] <= req.generated:  # back from a preemption
                self._charge_token(req)
            if self.charge_recompute:
                self._deficit[req.client] -= self.w_e * recomputed_tokens(req, cached)
        return before - self._deficit[req.client]

    def _charge_token(self, req: Request) -> None:
        self._deficit[req.client] -= self.w_q
        self._charged[req.rid] = req.generated + 1

    def on_decode_step(self, running: list[Request], now: float) -> float:
        for req in running:
            self._charge_token(req)
        return self.w_q * len(running)

    def charge_steps(self, running: list[Request], steps: int, now: float) -> bool:
        """w_q per token: one product per client where the deficits are whole numbers (then it
        equals the per-step sums exactly); otherwise the engine charges step by step."""
        per_step = Counter(req.client for req in running)
        exact = (
            type(self).on_decode_step is DLPM.on_decode_step
            and float(self.w_q).is_integer()
            and all(
                self._deficit[c].is_integer() and abs(self._deficit[c]) + self.w_q * n * steps < 2.0**52
                for c, n in per_step.items()
            )
        )
        if not exact:
            return False
        for client, n in per_step.items():
            self._deficit[client] -= self.w_q * n * steps
        for req in running:
            self._charged[req.rid] = req.generated + steps
        return True

    def heads(self, running: list[Request], steps: int, budget: AdmissionBudget) -> list[tuple[int, Request]] | None:
        return None  # select refills deficits even when it admits nothing

    def on_finish(self, finished: list[Request], batch: list[Request], now: float) -> float:
        for req in finished:
            self._end_running(req)
        return 0.0

    def on_abort(self, req: Request, now: float) -> float:
        self._end_running(req)
        return 0.0

    def _end_running(self, req: Request) -> None:
        self._charged.pop(req.rid, None)
        self._running[req.client] -= 1
        self._leave_if_idle(req.client)

    # -- preemption ---------------------------------------------------------------------------------
    def on_preempt(self, req: Request, now: float) -> None:
        self._running[req.client] -= 1
        self._waiting[req.client] += 1
        super().on_preempt(req, now)

    def choose_victim(self, running: list[Request], now: float) -> Request:
        return max(running, key=self._victim_key)

    def victim_order(self, running: list[Request], now: float) -> list[Request]:
        if type(self).choose_victim is not DLPM.choose_victim:
            return victims_one_by_one(self, running, now)
        return sorted(running, key=self._victim_key, reverse=True)

    def _victim_key(self, req: Request) -> tuple:
        """The smallest deficit first, then the latest arrival."""
        return (-self._deficit[req.client], arrival_key(req))
