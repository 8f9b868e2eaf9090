"""The ledger capability: per-client service counters a scheduler keeps (`Traits.ledger`).

The server's and the gateway's metrics read them (`counters`, `counter_of`, `weight_of`), the
clients file sets weights (`set_weight`, with `Traits.weights`), the gateway corrects a charge once
the upstream reports its usage or refunds a failed request (`adjust`), routers adopt cluster-wide
totals (`set_counter`), and idle clients are forgotten (`forget`).
"""

from abc import ABC, abstractmethod
from collections.abc import Callable


class Ledger(ABC):
    """Per-client counters, in counter units (service / weight for a weighted scheduler)."""

    @abstractmethod
    def counter_of(self, client: str) -> float:
        """One client's counter (0 for a client never seen)."""

    @abstractmethod
    def counters(self) -> dict[str, float]:
        """Every known client's counter (a copy)."""

    def weight_of(self, client: str) -> float:
        """One client's share weight (1 unless set)."""
        return 1.0

    def set_weight(self, client: str, weight: float) -> None:
        """Give a client a share weight (only with `Traits.weights`)."""
        raise NotImplementedError(f"{type(self).__name__} takes no weights")

    @abstractmethod
    def adjust(self, client: str, delta: float) -> None:
        """Add `delta` to a client's counter: a correction once the service is known, or a refund
        (negative) of service that was not delivered."""

    @abstractmethod
    def set_counter(self, client: str, value: float) -> None:
        """Overwrite a client's counter (a router adopting the cluster-wide totals)."""

    @abstractmethod
    def forget(self, client: str, now: float) -> bool:
        """Drop what is kept for a client with nothing waiting or running, where dropping it cannot
        change a later decision (each scheduler's docstring says when). True: nothing more can be
        dropped; False: ask again later."""


def forgets(scheduler) -> Callable[[str, float], bool]:
    """What drops an idle client's state in `scheduler` (`forget(client, now)`): its ledger's, or,
    for a scheduler without counters, nothing to drop."""
    return scheduler.forget if scheduler.traits.ledger else _nothing_to_forget


def _nothing_to_forget(client: str, now: float) -> bool:
    return True
