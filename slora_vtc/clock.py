"""Clocks. The engine and schedulers read time only through one of these."""

import time
from abc import ABC, abstractmethod


class Clock(ABC):
    @abstractmethod
    def now(self) -> float:
        """Seconds since the run started."""

    @abstractmethod
    def advance(self, seconds: float) -> None:
        """Account for a step that took `seconds` (a virtual clock moves; a wall clock already did)."""

    @abstractmethod
    def wait_until(self, t: float) -> None:
        """Idle until time t."""


class VirtualClock(Clock):
    """Simulated time: moves only when told to, so a 10-minute run takes milliseconds."""

    def __init__(self, start: float = 0.0):
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def wait_until(self, t: float) -> None:
        self._now = max(self._now, t)


class WallClock(Clock):
    """Real time for real runs, measured from construction.

    With `scale` s, s workload seconds pass per wall-clock second: arrivals come s times faster
    and every step looks s times longer, as if the hardware were s times slower.
    """

    def __init__(self, scale: float = 1.0, origin: float | None = None):
        if scale <= 0:
            raise ValueError(f"time scale must be positive, got {scale}")
        self.scale = scale
        # perf_counter's reading at time 0: another process on this machine (serve's engine process) may share it
        self.origin = time.perf_counter() if origin is None else origin

    def now(self) -> float:
        return (time.perf_counter() - self.origin) * self.scale

    def advance(self, seconds: float) -> None:
        pass

    def wait_until(self, t: float) -> None:
        delay = (t - self.now()) / self.scale
        if delay > 0:
            time.sleep(delay)
