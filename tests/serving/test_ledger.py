"""The per-client ledger the server and the gateway share (serving/ledger.py): outcomes, idle expiry
with the totals kept, a scheduler that keeps state asked again, and labels freed by expiry.

Every expected value is worked out by hand from the events each test makes."""

import math

import pytest

from slora_vtc.serving.ledger import OTHER, ClientLedger, Tally
from slora_vtc.serving.window import ServiceWindow


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_idle_clients_expire_oldest_first_with_their_numbers_kept_in_the_total():
    clock = Clock()
    ledger = ClientLedger(Tally, max_labels=2, now=clock)
    assert ledger.begin("a") is True  # a was idle (new)
    ledger.refuse("b")  # b only refused: idle since 0
    ledger.serve("a", 8.0, now=0.0)
    clock.t = 5.0
    assert ledger.end("a", "finished") is True  # a idle since 5
    clock.t = 6.0
    ledger.begin("c")
    assert ledger.end("c", "aborted") is True  # c idle since 6 (no label: a and b hold both)
    clock.t = 7.0
    ledger.refuse("b")  # still calling: b's idle time starts again, at 7
    assert list(ledger.idle) == ["a", "c", "b"]
    assert ledger.until_due(10.0) == 5.0 + 10.0 - 7.0

    asked = []

    def forget(client: str, now: float) -> bool:
        asked.append((client, now))
        return client != "c" or now >= 26.0  # the scheduler keeps some of c's state at first

    clock.t = 15.0
    assert ledger.expire(10.0, forget) == ["a"]  # a: 5 + 10 <= 15; c: 6 + 10 > 15
    assert asked == [("a", 15.0)] and set(ledger.clients) == {"b", "c"} and ledger.forgotten == 1
    clock.t = 16.0
    assert ledger.expire(10.0, forget) == ["c"]  # its scheduler kept state: asked again at 16 + 10
    assert list(ledger.idle) == ["b", "c"] and ledger.idle["c"] == 16.0
    assert ledger.until_due(10.0) == 7.0 + 10.0 - 16.0  # b is next
    clock.t = 26.0
    assert ledger.expire(10.0, forget) == ["b", "c"]
    assert asked[-2:] == [("b", 26.0), ("c", 26.0)]
    assert ledger.clients == {} and ledger.idle == {} and ledger.forgotten == 3 and ledger.until_due(10.0) is None
    # the total keeps every forgotten client's numbers; with no client left, "other" is all of it
    total = ledger.total
    assert (total.service, total.finished, total.aborted, total.failed, total.rejected, total.live) == (
        8,
        1,
        1,
        0,
        2,
        0,
    )
    assert ledger.labelled() == {OTHER: total}


def test_a_returning_client_starts_over_under_a_free_label():
    clock = Clock()
    ledger = ClientLedger(Tally, max_labels=1, now=clock)
    ledger.begin("a")
    ledger.serve("a", 5.0, now=0.0)
    ledger.end("a", "failed")
    clock.t = 10.0
    ledger.expire(10.0, lambda client, now: True)
    assert ledger.labels == {}  # a's label was freed with it
    ledger.begin("a")
    ledger.serve("a", 3.0, now=10.0)
    shown = ledger.labelled()
    assert (shown["a"].service, shown["a"].failed, shown["a"].live) == (3.0, 0, 1)
    assert (shown[OTHER].service, shown[OTHER].failed, shown[OTHER].live) == (5.0, 1, 0)


def test_a_busy_client_is_never_idle_and_outcomes_are_one_set_of_words():
    clock = Clock()
    ledger = ClientLedger(Tally, now=clock)
    ledger.begin("a")
    ledger.begin("a")
    assert ledger.end("a", "rejected") is False  # one request still in the system
    clock.t = 1000.0
    assert ledger.expire(10.0, lambda client, now: True) == [] and "a" in ledger
    assert ledger.clients["a"].outcomes == {"rejected": 1}
    with pytest.raises(ValueError, match="unknown outcome 'stopped'"):
        ledger.end("a", "stopped")


def test_a_refund_in_the_second_of_its_service_leaves_the_window_as_if_nothing_was_served():
    window = ServiceWindow(window_s=60)
    window.set_live("a", True)
    window.add("a", 10.0, now=3.2)
    window.add("a", -10.0, now=3.7)  # the gateway refunds a failed request
    assert window.active == 1 and window.service == {} and math.isnan(window.jain())  # live, nothing served
    window.add("b", 4.0, now=5.0)
    window.advance(64.0)  # second 3 leaves the window: nothing to take out for a
    assert window.service == {"b": 4.0} and window.total == 4.0 and window.active == 2
    window.set_live("a", False)
    assert window.jain() == 1.0
