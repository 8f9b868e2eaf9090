"""A progress bar that a short run does not pay for: tqdm is imported, and the bar drawn, only
once the run has lasted `delay_s` (importing tqdm takes longer than simulating a paper suite)."""

import time
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


class LazyProgress:
    """Counts `update()` calls; after `delay_s` of wall time, shows them on a tqdm bar (to stderr,
    removed when done). Disabled, it only counts. Use it as a context manager."""

    def __init__(self, total: int, desc: str = "", unit: str = "req", enabled: bool = True, delay_s: float = 1.0):
        self.total, self.desc, self.unit = total, desc, unit
        self.count = 0
        self._due = time.monotonic() + delay_s if enabled else None
        self._bar = None

    def update(self, n: int = 1) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._due is not None and time.monotonic() >= self._due:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False, initial=self.count)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "LazyProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tracked(items: Sequence[T], desc: str, unit: str, enabled: bool = True) -> Iterator[T]:
    """Each of `items` in turn, counted on a LazyProgress bar (closed when they run out)."""
    with LazyProgress(len(items), desc, unit, enabled) as bar:
        for item in items:
            yield item
            bar.update()
