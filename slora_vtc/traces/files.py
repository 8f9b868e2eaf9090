"""Opening the files the trace readers take, by their bytes rather than their names: gzip is
unpacked wherever it appears, and a directory, a pickle, a parquet file or a binary file is
recognised, so every problem becomes one UserError naming the file."""

import gzip
import io
import json
import zlib
from pathlib import Path

import numpy as np

from slora_vtc.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"


def first_line(error: Exception) -> str:
    """A library's message, cut to one line (the CLI prints errors as one line)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def read_input(path: Path, directory_hint: str) -> bytes:
    """The file's bytes, gunzipped when they are gzip-compressed."""
    if path.is_dir():
        raise UserError(f"{path}: is a directory; {directory_hint}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read the file ({e.strerror})") from None
    return _gunzipped(path, data)


def _gunzipped(path: Path, data: bytes) -> bytes:
    if not data.startswith(GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise UserError(f"{path}: not a readable gzip file ({first_line(e)})") from None


def inner_suffix(path: Path) -> str:
    """The suffix naming the format under any .gz: t.csv.gz -> .csv."""
    return Path(path.name.removesuffix(".gz")).suffix


def is_pickle(data: bytes) -> bool:
    """Binary pickles (protocol 2 and later) start with PROTO and the protocol number."""
    return len(data) > 1 and data[0] == 0x80 and 2 <= data[1] <= 5


def is_parquet(path: Path, data: bytes) -> bool:
    return inner_suffix(path) == ".parquet" or data.startswith(PARQUET_MAGIC)


def decode_text(path: Path, data: bytes, formats: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a text file (byte {e.start} is not UTF-8; {formats})") from None


def parquet_rows(path: Path, data: bytes) -> list[dict]:
    """Rows as plain Python values, without the fields a row lacks (parquet fills them with None or NaN)."""
    import pandas as pd

    try:
        frame = pd.read_parquet(io.BytesIO(data))
    except Exception as e:  # pyarrow raises many types for a bad file
        raise UserError(f"{path}: cannot read parquet ({first_line(e)})") from None
    return [{k: plain(v) for k, v in row.items() if not _is_missing(v)} for row in frame.to_dict("records")]


def _is_missing(value) -> bool:
    """None, NaN, NaT or pd.NA: how a parquet column fills the rows that lack it."""
    import pandas as pd

    return pd.api.types.is_scalar(value) and bool(pd.isna(value))


def plain(value):
    """numpy arrays and scalars (how parquet returns lists and numbers) as lists and Python numbers."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def json_lines(path: Path, text: str) -> list[tuple[int, object]]:
    """(line number, value) of every non-blank line of a JSONL text."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return rows
