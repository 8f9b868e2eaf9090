"""Result files (docs/design.md, "Result files"): one JSON line per run, also readable from the artifact's files."""

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slora_vtc.errors import UserError, json_kind
from slora_vtc.request import Request, State

if TYPE_CHECKING:  # numpy only for the metrics' arrays: writing a result file needs none
    import numpy as np

RESPONSE_FIELDS = ("client", "prompt_len", "output_len", "req_time", "first_token_latency", "request_latency", "status")
STATUSES = tuple(s.value for s in State)  # what a response's status may be
MEMORY_FIELDS = ("cached_tokens", "preemptions", "recomputed")  # written only when not 0 (the paper's runs have none)


@dataclass(frozen=True)
class Response:
    client: str
    prompt_len: int
    output_len: int
    req_time: float
    first_token_latency: float  # -1 when never served
    request_latency: float  # -1 when never served
    status: str = "finished"
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache, over all its prefills
    preemptions: int = 0
    recomputed: int = 0  # tokens computed again after its preemptions
    replica: int | None = None  # a cluster run's replica that served it (-1: none); None (not written) for one engine

    @classmethod
    def of(cls, req: Request, replica: int | None = None) -> "Response":
        served = req.state is State.FINISHED
        first = req.first_token_time - req.arrival if served else -1.0
        total = req.finish_time - req.arrival if served else -1.0
        output_len = req.generated if served else req.max_new_tokens  # fewer when stopped at EOS
        prompt_len = req.prompt_len - req.added_tokens  # the client's prompt, as the artifact's client recorded it
        return cls(
            req.client,
            prompt_len,
            output_len,
            req.arrival,
            first,
            total,
            req.state.value,
            req.cached_tokens,
            req.preemptions,
            req.recomputed,
            replica,
        )

    def record(self) -> dict:
        """Its fields in order, the memory ones only when not 0 and the replica only in a cluster run
        (built field by field: this runs once per request of every result file written)."""
        fields = {
            "client": self.client,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "req_time": self.req_time,
            "first_token_latency": self.first_token_latency,
            "request_latency": self.request_latency,
            "status": self.status,
        }
        if self.cached_tokens:
            fields["cached_tokens"] = self.cached_tokens
        if self.preemptions:
            fields["preemptions"] = self.preemptions
        if self.recomputed:
            fields["recomputed"] = self.recomputed
        if self.replica is not None:
            fields["replica"] = self.replica
        return fields


@dataclass(frozen=True)
class RunResult:
    config: dict
    total_time: float
    responses: tuple[Response, ...]

    @classmethod
    def of(
        cls, config: dict, requests: list[Request], total_time: float, replica_of: dict[int, int] | None = None
    ) -> "RunResult":
        """`replica_of`: rid -> replica, for a cluster run (each response then records its replica, -1 if none)."""
        if replica_of is None:
            return cls(config, total_time, tuple(Response.of(r) for r in requests))
        return cls(config, total_time, tuple(Response.of(r, replica_of.get(r.rid, -1)) for r in requests))

    @property
    def clients(self) -> list[str]:
        return sorted({r.client for r in self.responses}, key=client_sort_key)

    def array(self, name: str) -> "np.ndarray":
        """One response field as a numpy array (cached), for the metrics."""
        cache = self.__dict__.setdefault("_arrays", {})
        if name not in cache:
            import numpy as np

            cache[name] = np.array([getattr(r, name) for r in self.responses])
        return cache[name]

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.responses)

    def to_json(self) -> str:
        record = {
            "config": self.config,
            "result": {"total_time": self.total_time, "responses": [r.record() for r in self.responses]},
        }
        return json.dumps(record, check_circular=False)  # a tree of fresh dicts: no cycle to look for


def client_sort_key(name: str) -> tuple:
    """client2 < client10; names without a trailing number sort after, alphabetically."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return (stem, int(digits) if digits else -1)


def check_writable(path: Path, what: str = "a result file") -> None:
    """Fail before a run, in one line, where its output (`what`) could not be written once it ends."""
    if path.is_dir():
        raise UserError(f"{path}: is a folder; --out takes {what}")
    existing = next(p for p in path.parents if p.exists())  # the writers create the folders below it
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise UserError(f"{path}: cannot write {what} there ({existing} is not a folder one can write in)")


def write_results(path: str | Path, results: list[RunResult], append: bool = False) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w") as f:
        for result in results:
            f.write(result.to_json() + "\n")


def read_results(path: str | Path) -> list[RunResult]:
    """Read our result files and the artifact's (client named `adapter_dir`, no status field)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise UserError(f"{path}: cannot read result file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a result file (not UTF-8 text)") from None
    return [_parse_line(path, n, line) for n, line in enumerate(lines, 1) if line.strip()]


def _parse_line(path: Path, lineno: int, line: str) -> RunResult:
    where = f"{path}:{lineno}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("result", {}), dict):
        raise UserError(f"{where}: expected {{'config': ..., 'result': {{'total_time', 'responses'}}}}")
    if "result" not in record:
        raise UserError(f"{where}: missing field 'result'")
    missing = [f for f in ("total_time", "responses") if f not in record["result"]]
    if missing:
        raise UserError(f"{where}: missing field '{missing[0]}'")
    result = record["result"]
    config = record.get("config", {})
    if not isinstance(config, dict):
        raise UserError(f"{where}: field 'config' must be an object, got {_kind(config)}")
    total_time = _time(where, "total_time", result["total_time"])
    raw = result["responses"]
    if not isinstance(raw, list):
        raise UserError(f"{where}: field 'responses' must be a list of responses, got {_kind(raw)}")
    responses = tuple(_parse_response(f"{where}: response {i}", r) for i, r in enumerate(raw))
    return RunResult(config, total_time, responses)


def _kind(value) -> str:
    """What a JSON value is, with the value where it is short, for a message."""
    kind = json_kind(value)
    if isinstance(value, bool):
        return f"{kind} ({json.dumps(value)})"
    if isinstance(value, int | float):
        return f"{kind} ({value})"
    if isinstance(value, str) and len(value) <= 40:
        return f"{kind} ({value!r})"
    return kind


def _number(where: str, name: str, value) -> float:
    """A finite JSON number (not a boolean) or a string holding one."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: field '{name}' is not a number, got {_kind(value)}") from None
    if not math.isfinite(number):
        raise UserError(f"{where}: field '{name}' must be a finite number, got {value}")
    return number


def _time(where: str, name: str, value) -> float:
    """Seconds: finite and >= 0."""
    number = _number(where, name, value)
    if number < 0:
        raise UserError(f"{where}: field '{name}' must be a time >= 0 s, got {value}")
    return number


def _count(where: str, name: str, value, least: int = 0) -> int:
    """A whole number >= `least`."""
    number = _number(where, name, value)
    if number != int(number):
        raise UserError(f"{where}: field '{name}' must be a whole number, got {value}")
    if number < least:
        raise UserError(f"{where}: field '{name}' must be >= {least}, got {value}")
    return int(number)


def _latency(where: str, name: str, value) -> float:
    """Seconds after the request was sent: >= 0, or -1 for a request never served."""
    number = _number(where, name, value)
    if number < 0 and number != -1:
        raise UserError(f"{where}: field '{name}' must be a time >= 0 s (or -1: never served), got {value}")
    return number


def _parse_response(where: str, raw: dict) -> Response:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected an object with fields {', '.join(RESPONSE_FIELDS)}, got {_kind(raw)}")
    raw = dict(raw)
    if "client" not in raw and "adapter_dir" in raw:
        raw["client"] = raw.pop("adapter_dir")
    missing = [f for f in RESPONSE_FIELDS[:-1] if f not in raw]
    if missing:
        raise UserError(f"{where}: missing field '{missing[0]}'")
    if not isinstance(raw["client"], str):
        raise UserError(f"{where}: field 'client' must be a string, got {_kind(raw['client'])}")
    prompt_len = _count(where, "prompt_len", raw["prompt_len"])
    output_len = _count(where, "output_len", raw["output_len"])
    req_time = _time(where, "req_time", raw["req_time"])
    first = _latency(where, "first_token_latency", raw["first_token_latency"])
    total = _latency(where, "request_latency", raw["request_latency"])
    if (first == -1) != (total == -1):
        raise UserError(
            f"{where}: fields 'first_token_latency' ({raw['first_token_latency']}) and 'request_latency' "
            f"({raw['request_latency']}) disagree: both are -1 for a request never served, else both times >= 0 s"
        )
    # the artifact writes no status: a request it never served (an RPM refusal) has latency -1
    status = raw.get("status", "finished" if first >= 0 else "rejected")
    if status not in STATUSES:
        raise UserError(f"{where}: field 'status' must be one of {', '.join(STATUSES)}, got {_kind(status)}")
    if status == "finished" and first < 0:
        raise UserError(f"{where}: field 'status' is 'finished', but its latencies are -1 (never served)")
    replica = raw.get("replica")
    return Response(
        raw["client"],
        prompt_len,
        output_len,
        req_time,
        first,
        total,
        status,
        *(_count(where, f, raw.get(f, 0)) for f in MEMORY_FIELDS),
        None if replica is None else _count(where, "replica", replica, least=-1),
    )
