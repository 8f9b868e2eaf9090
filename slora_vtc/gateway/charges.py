"""What the scheduler charges a request through the gateway, and how a charge is corrected.

The gateway drives the scheduler as the engine does: `on_prefill` charges the prompt at dispatch,
`on_decode_step` charges each streamed token after the first (the engine's first token comes with
the prefill, free), `on_finish` / `on_abort` settle a prediction; each call returns what it charged,
which the request's ticket adds up. The gateway only sees an estimate of the prompt's length until
the upstream's `usage` arrives; it then corrects the counter by the difference. A request that fails
is refunded whatever it was charged.

Only VTC-family schedulers keep counters; for the others every correction is a no-op.
"""

from slora_vtc.cost import CostFunction
from slora_vtc.sched import Scheduler

BYTES_PER_TOKEN = 4  # a typical BPE tokenizer's average on English text; corrected from `usage`


def estimate_tokens(text: str) -> int:
    return max(1, -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN))


def engine_charge(cost: CostFunction, prompt: float, tokens: int) -> float:
    """What VTC charges a request without prediction: h(x, 0), then h(x, n) - h(x, n - 1) for tokens 2..y."""
    return cost(prompt, 0) + (cost(prompt, tokens) - cost(prompt, 1) if tokens >= 1 else 0.0)


class Corrections:
    """Corrects what a scheduler charged, through its ledger (`Traits.ledger`): under rate limits too,
    and nothing to do for a scheduler without counters."""

    def __init__(self, scheduler: Scheduler):
        self.ledger = scheduler if scheduler.traits.ledger else None

    @property
    def kept(self) -> bool:
        """Whether the scheduler keeps counters (a VTC-family scheduler)."""
        return self.ledger is not None

    def adjust(self, client: str, delta: float) -> None:
        """Add `delta` (in counter units: service / weight) to a client's counter."""
        if delta and self.ledger is not None:
            self.ledger.adjust(client, delta)

    def weight(self, client: str) -> float:
        return self.ledger.weight_of(client) if self.ledger is not None else 1.0
