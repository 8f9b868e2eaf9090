"""Trace files: one request per record with client, prompt_len, output_len, req_time.

Formats: our JSONL (one object per line), CSV (a header row) or parquet (those four columns), the
paper's JSON (`{"requests": [...]}`, as in traces/lmsys_real_trace.json), and the artifact's pickle
(through a restricted unpickler), each optionally gzip-compressed (`t.jsonl.gz`). Parquet, pickle
and gzip are recognised by their bytes as well as their names. Records become RequestSpecs
(`req_time` is their `arrival`). Every problem is a UserError naming file, line and field.

An optional field `segments` gives the prompt as named pieces that requests share
(slora_vtc.segments): in JSONL a list of [name, length] pairs, `[["doc7", 1200], ["q3", 40]]`; in
CSV and parquet the text `doc7:1200|q3:40` (a name may hold ':' but not '|'); either form is read
from any format. The lengths are positive whole numbers summing to prompt_len. Written only when
some record has segments (CSV / parquet: an empty cell for a record without).
"""

import csv
import gzip
import io
import json
import math
from pathlib import Path

from slora_vtc.errors import UserError, json_kind
from slora_vtc.results import client_sort_key
from slora_vtc.segments import Segments, format_segments, parse_segments
from slora_vtc.traces.artifact_pickle import load_artifact_pickle
from slora_vtc.traces.files import (
    decode_text,
    inner_suffix,
    is_parquet,
    is_pickle,
    json_lines,
    parquet_rows,
    read_input,
)
from slora_vtc.workload import RequestSpec, Workload

FIELDS = ("client", "prompt_len", "output_len", "req_time")
TRACE_FORMATS = "traces are JSONL, CSV, parquet, the paper's JSON or the artifact's .pkl, optionally .gz"


def read_trace(path: str | Path) -> list[RequestSpec]:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such trace file")
    data = read_input(path, f"give one trace file ({TRACE_FORMATS})")
    if inner_suffix(path) == ".pkl" or is_pickle(data):
        return _checked(path, [(None, r) for r in load_artifact_pickle(path, data)])
    if is_parquet(path, data):
        return _checked(path, [(None, r) for r in parquet_rows(path, data)])
    return _checked(path, _text_rows(path, decode_text(path, data, TRACE_FORMATS)))


def _text_rows(path: Path, text: str) -> list[tuple[int | None, dict]]:
    suffix = inner_suffix(path)
    if suffix == ".csv":
        return [(n, row) for n, row in enumerate(csv.DictReader(text.splitlines()), start=2)]
    if suffix == ".json" and text.lstrip().startswith("{"):
        return _paper_json(path, text)
    return json_lines(path, text)


def _paper_json(path: Path, text: str) -> list[tuple[int | None, dict]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list):
        raise UserError(f"{path}: expected {{'requests': [...]}} (or one JSON object per line)")
    return [(None, r) for r in data["requests"]]


def _checked(path: Path, rows: list[tuple[int | None, object]]) -> list[RequestSpec]:
    records = []
    for index, (lineno, row) in enumerate(rows):
        where = f"{path}:{lineno}" if lineno is not None else f"{path}: request {index}"
        record = _record(where, row)
        if records and record.arrival < records[-1].arrival:
            raise UserError(
                f"{where}: field 'req_time' goes back in time ({record.arrival} after {records[-1].arrival}); "
                "sort the trace by req_time"
            )
        records.append(record)
    if not records:
        raise UserError(f"{path}: the trace has no requests")
    return records


def _record(where: str, row) -> RequestSpec:
    if not isinstance(row, dict):
        row = vars(row) if hasattr(row, "__dict__") else row
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a record with fields {', '.join(FIELDS)}")
    if "client" not in row and "adapter_dir" in row:
        row = {**row, "client": row["adapter_dir"]}
    for name in FIELDS:
        if row.get(name) in (None, ""):
            raise UserError(f"{where}: missing field '{name}'")
    if not isinstance(row["client"], str):
        raise UserError(f"{where}: field 'client' must be a string, got {json_kind(row['client'])}: {row['client']!r}")
    prompt_len, output_len = _count(where, row, "prompt_len"), _count(where, row, "output_len")
    if isinstance(row["req_time"], bool):
        raise UserError(f"{where}: field 'req_time' must be a number, got a boolean ({json.dumps(row['req_time'])})")
    try:
        req_time = float(row["req_time"])
    except (TypeError, ValueError):
        raise UserError(f"{where}: field 'req_time' is not a number: {row['req_time']!r}") from None
    if not math.isfinite(req_time) or req_time < 0:
        raise UserError(f"{where}: field 'req_time' must be a finite time >= 0, got {req_time}")
    return RequestSpec(
        row["client"], prompt_len, output_len, req_time, _segments(where, row.get("segments"), prompt_len)
    )


def _segments(where: str, value, prompt_len: int) -> Segments:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ()
    try:
        segments = parse_segments(value)
    except ValueError as e:
        raise UserError(f"{where}: field 'segments': {e}") from None
    total = sum(length for _, length in segments)
    if segments and total != prompt_len:
        raise UserError(f"{where}: field 'segments' sums to {total} tokens, but prompt_len is {prompt_len}")
    return segments


def _count(where: str, row: dict, name: str) -> int:
    value = row[name]
    if isinstance(value, bool):
        raise UserError(f"{where}: field '{name}' must be a whole number, got a boolean ({json.dumps(value)})")
    try:
        count = int(value)
        if count != float(value):
            raise ValueError
    except (TypeError, ValueError):
        raise UserError(f"{where}: field '{name}' is not a whole number: {value!r}") from None
    if count <= 0:
        raise UserError(f"{where}: field '{name}' must be positive, got {count}")
    return count


WRITTEN_FORMATS = "name it .jsonl, .csv or .parquet (any other name is JSONL), optionally + .gz"


def write_trace(records: list[RequestSpec], path: str | Path) -> None:
    """JSONL, or CSV / parquet when the file name ends in .csv / .parquet; gzip-compressed when it
    then ends in .gz (t.csv.gz), so that read_trace reads back what it wrote."""
    path = Path(path)
    check_trace_out(path)
    data = _encoded(records, inner_suffix(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    except OSError as e:
        raise UserError(f"{path}: cannot write the trace ({e.strerror or e})") from None


def check_trace_out(path: str | Path) -> None:
    """Refuse a name read_trace would read as another format than write_trace writes (before a build)."""
    path = Path(path)
    misread = {".json": "the paper's JSON ({'requests': [...]})", ".pkl": "the artifact's pickle"}
    suffix = inner_suffix(path)
    if suffix in misread:
        raise UserError(
            f"{path}: a trace named {suffix}{'.gz' if path.name.endswith('.gz') else ''} is read back as "
            f"{misread[suffix]}, which trace build does not write; {WRITTEN_FORMATS}"
        )


def _encoded(records: list[RequestSpec], suffix: str) -> bytes:
    fields = FIELDS + ("segments",) if any(r.segments for r in records) else FIELDS
    if suffix == ".csv":
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=fields)
        writer.writeheader()
        writer.writerows(_row(r, fields, as_text=True) for r in records)
        return text.getvalue().encode()
    if suffix == ".parquet":
        import pandas as pd

        binary = io.BytesIO()
        pd.DataFrame([_row(r, fields, as_text=True) for r in records], columns=list(fields)).to_parquet(
            binary, index=False
        )
        return binary.getvalue()
    return "".join(json.dumps(_row(r, fields, as_text=False)) + "\n" for r in records).encode()


def _row(spec: RequestSpec, fields: tuple[str, ...], as_text: bool) -> dict:
    row = {
        "client": spec.client,
        "prompt_len": spec.prompt_len,
        "output_len": spec.output_len,
        "req_time": spec.arrival,
    }
    if "segments" in fields:
        row["segments"] = _segments_text(spec.segments) if as_text else [list(pair) for pair in spec.segments]
    return row


def _segments_text(segments: Segments) -> str:
    try:
        return format_segments(segments)
    except ValueError as e:
        raise UserError(f"cannot write the trace as CSV / parquet: {e}; write JSONL") from None


def trace_workload(name: str, records: list[RequestSpec], duration: float | None = None) -> Workload:
    """A replayable workload; with a duration, only requests sent before it are kept."""
    span = records[-1].arrival if records else 0.0
    duration = span if duration is None else duration
    clients = tuple(sorted({r.client for r in records}, key=client_sort_key))
    return Workload(name, clients, duration, tuple(r for r in records if r.arrival <= duration))
