"""Stop strings on streamed text: cut the text at the first stop string, hold back what may start one.

Text arrives in pieces; a stop string may span pieces. The matcher releases text only once it can
no longer be part of a stop string: a trailing piece that is the start of some stop string waits
for the next piece (or for the end, when it is released after all). The stop is the one the text
completes first (the earliest end; of those ending there, the one starting first), as a generation
stops as soon as a stop string appears, so the answer does not depend on how the text was split.
"""


class StopMatcher:
    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = tuple(s for s in stops if s)
        self.matched: str | None = None  # the stop string found, once found
        self._held = ""

    def push(self, text: str) -> str:
        """The part of `text` (with what was held back) that is safe to emit; sets `matched` on a hit."""
        if not self.stops or self.matched is not None:
            return text if self.matched is None else ""
        text = self._held + text
        hits = [(i + len(s), i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            _, at, self.matched = min(hits)
            self._held = ""
            return text[:at]
        keep = self._partial_len(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back, at the end of a generation that met no stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_len(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper start of some stop string."""
        longest = min(len(text), max(len(s) for s in self.stops) - 1)
        for n in range(longest, 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0
