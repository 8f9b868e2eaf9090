"""A suite: a named workload, generated from a seed or replayed from a trace file."""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from slora_vtc.config import DEFAULT_POOL_TOKENS
from slora_vtc.errors import UserError
from slora_vtc.workload import RequestSpec, Workload, check_size, client_names

MISSING_TRACE = (
    "the '{suite}' suite replays a trace that ships with the repository, and {path} is missing. "
    "Restore it (git checkout -- traces/), pass --trace FILE (JSONL, CSV or parquet with client, "
    "prompt_len, output_len, req_time), or build one from Chatbot Arena logs: "
    "slora-vtc trace build RAW.jsonl --rate 2.5 --duration 600 --out trace.jsonl"
)

Generator = Callable[[float, int], list[RequestSpec]]  # (duration, seed) -> requests, the same for the same arguments


@dataclass(frozen=True)
class Suite:
    name: str
    figure: str  # the paper's figure(s), arXiv v2 numbering; "-" for suites beyond the paper
    description: str
    num_clients: int  # for a trace suite, the clients come from the trace
    duration: float
    generate: Generator | None = None
    pool_tokens: int = DEFAULT_POOL_TOKENS
    schedulers: tuple[str, ...] = ("vtc",)  # what its figure compares
    trace: str | None = None  # a trace suite: the shipped trace it replays unless given another

    @property
    def replays_trace(self) -> bool:
        return self.trace is not None

    def workload(self, duration: float | None = None, seed: int = 42, trace_path: str | None = None) -> Workload:
        duration = self.duration if duration is None else duration
        if not 0 < duration < math.inf:
            raise UserError(f"duration must be positive and finite, got {duration}")
        if seed < 0:
            raise UserError(f"the seed must not be negative, got {seed}")
        if self.replays_trace:
            return self._replay(duration, trace_path)
        if trace_path is not None:
            raise UserError(
                f"suite '{self.name}' is generated from a seed; "
                "--trace applies only to trace suites (real) and to `replay`"
            )
        if duration > self.duration:  # its requests grow in proportion to its duration: estimate before making them
            sample = len(_generated(self, self.duration, seed).specs)
            check_size(sample * duration / self.duration, f"suite '{self.name}' over {duration:g} s")
        return _generated(self, duration, seed)

    def _replay(self, duration: float, trace_path: str | None) -> Workload:
        from slora_vtc.data import data_root
        from slora_vtc.traces import read_trace, trace_workload

        path = trace_path or data_root() / self.trace
        if trace_path is None and not path.exists():
            raise UserError(MISSING_TRACE.format(suite=self.name, path=path))
        return trace_workload(self.name, read_trace(path), duration)


@lru_cache(maxsize=4)
def _generated(suite: Suite, duration: float, seed: int) -> Workload:
    """A generated workload, kept for the next call with the same arguments (it is immutable, and a
    run asks for it more than once: the CLI's checks, then the run)."""
    return Workload(suite.name, client_names(suite.num_clients), duration, tuple(suite.generate(duration, seed)))
