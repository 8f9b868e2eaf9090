"""Token-granular slot allocators: one slot holds one token's K/V (per layer), or one adapter row.

`TokenPool` hands out slot ids, which a real backend indexes its K/V cache with and the prefix
cache's tree records. `CountingPool` only counts: a simulated run without the prefix cache reads no
slot id, so it needs only how many slots are free (the same counts a TokenPool would have), and
imports no numpy.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


class PoolExhausted(RuntimeError):
    """More slots were asked for than are free: the admission check should have prevented it."""


class TokenPool:
    """A stack of free slot indices; alloc and free are O(n) numpy copies."""

    hands_out_ids = True

    def __init__(self, size: int):
        import numpy as np

        self.size = size
        self._free = np.arange(size - 1, -1, -1, dtype=np.int64)
        self._top = size
        self._in_use = np.zeros(size, dtype=bool)

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def num_used(self) -> int:
        return self.size - self._top

    def alloc(self, n: int) -> "np.ndarray":
        if n > self._top:
            raise PoolExhausted(f"asked for {n} slots, {self._top} of {self.size} free")
        self._top -= n
        slots = self._free[self._top : self._top + n].copy()
        self._in_use[slots] = True
        return slots

    def free(self, slots) -> None:
        import numpy as np

        slots = np.asarray(slots, dtype=np.int64)
        if not self._in_use[slots].all():
            raise ValueError("freeing a slot that is not allocated (double free)")
        self._in_use[slots] = False
        if np.count_nonzero(self._in_use) != self.size - self._top - len(slots):  # one slot twice (cheaper than unique)
            self._in_use[slots] = True
            raise ValueError("freeing a slot that is not allocated (double free)")
        self._free[self._top : self._top + len(slots)] = slots
        self._top += len(slots)


class CountingPool:
    """A pool that names no slot: `alloc(n)` takes n slots and returns n, `free(n)` gives n back.

    For a simulated run without the prefix cache (MemoryManager keeps each request's count instead
    of its slot ids). Freeing more than is allocated is the counting form of a double free.
    """

    hands_out_ids = False

    def __init__(self, size: int):
        self.size = size
        self.num_free = size

    @property
    def num_used(self) -> int:
        return self.size - self.num_free

    def alloc(self, n: int) -> int:
        if n > self.num_free:
            raise PoolExhausted(f"asked for {n} slots, {self.num_free} of {self.size} free")
        self.num_free -= n
        return n

    def free(self, n: int) -> None:
        if n > self.size - self.num_free:
            raise ValueError(f"freeing {n} slots, {self.size - self.num_free} are allocated (a double free)")
        self.num_free += n
