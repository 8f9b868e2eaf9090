"""A step log: one JSON object per engine step, written by the vLLM plugin (`"step_log": PATH` in its
additional config) and by our engine (`--step-log PATH`), read by `slora-vtc calibrate --vllm-steps`
to fit the simulator's step time (docs/vllm.md).

Each line holds a `StepRecord`'s fields. Times are seconds: `t` when the step started, counted from
the log's first step; `wall_s` how long it took; `gap_s` the time between the previous step's end and
its start (the host's work outside steps). Prefill: the prompt tokens the step computed
(`prefill_tokens`, over `prefill_reqs` requests), `prefill_pairs` the sum over its chunks of length x
the positions before the chunk (what attention over earlier K/V costs), `cached_tokens` the
prefix-cache hits of requests first scheduled in it. Decode: `decode_reqs` requests, attending over
`context_tokens` tokens in all. `kv_tokens`: tokens held in the KV cache; `preempted`: requests
preempted in the step; `arrived`: requests the engine took in since the step before it was scheduled
(when each request reached the engine, to within a step: scripts/vllm_fidelity.py replays them so).
"""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO

from slora_vtc.errors import UserError, finite_nonnegative


@dataclass(frozen=True)
class StepRecord:
    step: int
    t: float
    wall_s: float
    gap_s: float
    prefill_tokens: int
    prefill_pairs: int
    prefill_reqs: int
    cached_tokens: int
    decode_reqs: int
    context_tokens: int
    kv_tokens: int
    preempted: int = 0
    arrived: int = 0


FIELDS = tuple(f.name for f in fields(StepRecord))
COUNTS = frozenset(f.name for f in fields(StepRecord) if f.type is int)  # the others are seconds
OPTIONAL = ("preempted", "arrived")  # logs written before these fields were added lack them


class StepLogWriter:
    """Writes one line per step to a file (opened at the first step, line-buffered); `open()` opens it
    at once, so that a path that cannot be written is a UserError before the first step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file: IO[str] | None = None

    def open(self) -> "StepLogWriter":
        if self._file is None:
            try:
                self._file = self.path.open("w", buffering=1)
            except OSError as e:
                raise UserError(f"{self.path}: cannot write the step log ({e.strerror or e})") from None
        return self

    def write(self, record: StepRecord) -> None:
        self.open()._file.write(json.dumps(asdict(record)) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_step_log(path: str | Path) -> list[StepRecord]:
    """Every step of a log; a line that is not a step record is a UserError naming the file and line."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the step log ({e})") from None
    return [_record(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]


def _record(path, number: int, line: str) -> StepRecord:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{number}: not JSON ({e.msg})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}:{number}: a step record is a JSON object")
    missing = [name for name in FIELDS if name not in raw and name not in OPTIONAL]
    if missing:
        raise UserError(f"{path}:{number}: missing field '{missing[0]}'")
    try:
        return StepRecord(**{name: _number(name, raw[name]) for name in FIELDS if name in raw})
    except ValueError as e:
        raise UserError(f"{path}:{number}: {e}") from None


def _number(name: str, value) -> float | int:
    if not finite_nonnegative(value):
        raise ValueError(f"field '{name}' must be a number >= 0, got {value!r}")
    if name in COUNTS:
        if value != int(value):
            raise ValueError(f"field '{name}' counts tokens, requests or steps: a whole number, got {value!r}")
        return int(value)
    return value
