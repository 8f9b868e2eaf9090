"""When the sampled requests arrive: the records' own timestamps, or a seeded Poisson process for
data without any (the rules are described in slora_vtc.traces.build)."""

import math
from datetime import datetime, timezone

import numpy as np

from slora_vtc.errors import UserError

TIME_FIELDS = ("tstamp", "timestamp")
ARRIVAL_RULES = ("auto", "timestamps", "poisson")


def time_field(record: dict) -> str | None:
    return next((f for f in TIME_FIELDS if record.get(f) is not None), None)


def arrival_rule(path, records: list[dict], requested: str) -> str:
    """'timestamps' or 'poisson': what `requested` (one of ARRIVAL_RULES) means for these records."""
    if requested not in ARRIVAL_RULES:
        raise UserError(f"arrivals must be one of {', '.join(ARRIVAL_RULES)}, got {requested!r}")
    if requested == "poisson":
        return "poisson"
    untimed = [n for n, rec in enumerate(records, 1) if time_field(rec) is None]
    if not untimed:
        return "timestamps"
    if requested == "timestamps":
        raise UserError(
            f"{path}: record {untimed[0]}: missing field 'tstamp' (--arrivals timestamps needs a 'tstamp' or "
            "'timestamp' on every record; lmsys-chat-1m and ShareGPT logs have none: use --arrivals poisson or auto)"
        )
    if len(untimed) == len(records):
        return "poisson"
    timed = next(n for n, rec in enumerate(records, 1) if time_field(rec) is not None)
    raise UserError(
        f"{path}: record {untimed[0]}: missing field 'tstamp' while record {timed} has one; "
        "give every record a timestamp or none (--arrivals poisson ignores them)"
    )


def record_times(path, records: list[dict]) -> list[float]:
    """Each record's timestamp in seconds (every record has one: see arrival_rule)."""
    times = []
    for n, rec in enumerate(records, 1):
        field = time_field(rec)
        times.append(parse_time(f"{path}: record {n}", field, rec[field]))
    return times


def parse_time(where: str, field: str, value) -> float:
    """Unix seconds from a number, a numeric string or an ISO-8601 time (naive times are UTC)."""
    seconds = _seconds(value)
    if seconds is None or not math.isfinite(seconds):
        raise UserError(
            f"{where}: field '{field}' is not a time (Unix seconds or ISO-8601, e.g. 2023-04-01T10:00:00): {value!r}"
        )
    return seconds


def _seconds(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):  # pandas.Timestamp too, from a parquet datetime column
        return _as_utc(value).timestamp()
    if isinstance(value, str):
        return _seconds_from_text(value.strip())
    return None


def _seconds_from_text(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return _as_utc(datetime.fromisoformat(text)).timestamp()
    except ValueError:
        return None


def _as_utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def rescaled(times: list[float], duration: float) -> list[float]:
    """Times mapped linearly onto [0, duration]: the earliest to 0, the latest to duration."""
    start, end = min(times), max(times)
    scale = duration / (end - start) if end > start else 0.0
    return [(t - start) * scale for t in times]


def poisson_times(n: int, duration: float, rng: np.random.RandomState) -> list[float]:
    """The order statistics of n uniform draws on [0, duration]: a Poisson process conditioned on n arrivals."""
    return np.sort(rng.uniform(0.0, duration, size=n)).tolist()
