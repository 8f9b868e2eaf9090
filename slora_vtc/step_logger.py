"""The engine's step log (`--step-log PATH`): one StepRecord (slora_vtc/steplog.py) per forward pass,
from either loop (S-LoRA's prefill and decode passes, or chunked batching's mixed steps).

Times come from the engine's clock: `t` is a step's start since the first step, `wall_s` its length
(the simulated step time on a simulator), `gap_s` the time between the previous step's end and its
start (0 on a simulator, where nothing happens between steps). `arrived`: the requests handed to the
engine (`Engine.add_request`) since the step before.
"""

from dataclasses import dataclass

from slora_vtc.memory import MemoryManager
from slora_vtc.steplog import StepLogWriter, StepRecord


@dataclass(frozen=True)
class StepWork:
    """What one step computed (StepRecord's fields but its times)."""

    prefill_tokens: int = 0
    prefill_pairs: int = 0
    prefill_reqs: int = 0
    cached_tokens: int = 0
    decode_reqs: int = 0
    context_tokens: int = 0
    preempted: int = 0


class StepLogger:
    def __init__(self, writer: StepLogWriter, memory: MemoryManager, simulated: bool):
        self.writer, self.memory, self.simulated = writer, memory, simulated
        self._steps = 0
        self._first: float | None = None
        self._last_end: float | None = None
        self._arrived = 0

    def took_in(self) -> None:
        """The engine was handed a request."""
        self._arrived += 1

    def step(self, start: float, elapsed: float, work: StepWork) -> None:
        if self._first is None:
            self._first = start
        gap = 0.0 if self._last_end is None or self.simulated else max(0.0, start - self._last_end)
        self._last_end = start + elapsed
        memory = self.memory
        kv = memory.pool.num_used - sum(memory.slots_of(a) for a in memory.adapters)
        self.writer.write(StepRecord(step=self._steps, t=start - self._first, wall_s=elapsed, gap_s=gap,
                                     kv_tokens=kv, arrived=self._arrived, **work.__dict__))  # fmt: skip
        self._arrived = 0
        self._steps += 1

    def close(self) -> None:
        self.writer.close()
