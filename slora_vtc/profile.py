"""Cost profiles: measured prefill / decode time per request, as the artifact's profiler wrote them.

Format (JSON): profile[input_len][output_len] = [batch_size, prefill_s_per_request,
decode_s_per_request], where batch_size requests of that shape ran together (pool // (in + out))
and decode time covers all `output_len` decode steps. `slora-vtc profile` writes the same format,
plus prefix-hit points under the top-level key "prefix_hits": [[batch_size, cached_len, extend_len,
prefill_s_per_request], ...], each a prefill of batch_size requests whose first cached_len tokens'
K/V were already in the pool and that computed extend_len more (what a prefix-cache hit costs).
Files without that key (the artifact's) read as before; load_profile ignores it.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from slora_vtc.errors import UserError


@dataclass(frozen=True)
class ProfilePoint:
    input_len: int
    output_len: int
    batch_size: int
    prefill_s: float  # per request
    decode_s: float  # per request, all decode steps


@dataclass(frozen=True)
class PrefixHitPoint:
    batch_size: int
    cached_len: int  # tokens per request whose K/V were in the pool
    extend_len: int  # tokens per request the prefill computed
    prefill_s: float  # per request


PREFIX_HITS = "prefix_hits"


def load_profile(path: str | Path) -> list[ProfilePoint]:
    """Read and validate a profile file; any problem is a UserError naming the file and entry."""
    path = Path(path)
    raw = {k: v for k, v in _read(path).items() if k != PREFIX_HITS}
    if not raw:
        raise UserError(f"{path}: a profile is a non-empty object {{input_len: {{output_len: [...]}}}}")
    points = [_point(path, i, o, v) for i, row in raw.items() for o, v in _row(path, i, row).items()]
    if len(points) < 3:
        raise UserError(f"{path}: at least 3 measured points are needed to fit a step-time model")
    return points


def load_prefix_hits(path: str | Path) -> list[PrefixHitPoint]:
    """The file's prefix-hit points (none in a profile written before they existed)."""
    path = Path(path)
    hits = _read(path).get(PREFIX_HITS, [])
    if not isinstance(hits, list):
        raise UserError(f"{path}: '{PREFIX_HITS}' must be a list of [batch_size, cached_len, extend_len, prefill_s]")
    return [_hit(path, n, value) for n, value in enumerate(hits, 1)]


def _read(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: cannot read profile ({e.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text (JSON) file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a profile is a non-empty object {{input_len: {{output_len: [...]}}}}")
    return raw


def _row(path: Path, key: str, row) -> dict:
    if not isinstance(row, dict):
        raise UserError(f"{path}: entry '{key}' must map output lengths to measurements")
    return row


def _point(path: Path, i: str, o: str, value) -> ProfilePoint:
    where = f"{path}: entry [{i}][{o}]"
    try:
        input_len, output_len = int(i), int(o)
        batch, prefill, decode = value
        batch, prefill, decode = int(batch), float(prefill), float(decode)
    except (TypeError, ValueError):
        raise UserError(f"{where}: expected integer keys and [batch_size, prefill_s, decode_s]") from None
    if input_len <= 0 or output_len <= 0 or batch <= 0 or prefill < 0 or decode < 0:
        raise UserError(f"{where}: lengths and batch size must be positive, times non-negative")
    return ProfilePoint(input_len, output_len, batch, prefill, decode)


def _hit(path: Path, n: int, value) -> PrefixHitPoint:
    where = f"{path}: {PREFIX_HITS} entry {n}"
    try:
        batch, cached, extend, prefill = value
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (batch, cached, extend)):
            raise TypeError
        prefill = float(prefill)
    except (TypeError, ValueError):
        raise UserError(
            f"{where}: expected [batch_size, cached_len, extend_len, prefill_s] (three integers, then seconds)"
        ) from None
    if batch <= 0 or cached <= 0 or extend <= 0 or not prefill >= 0:
        raise UserError(f"{where}: batch size and lengths must be positive, the time non-negative")
    return PrefixHitPoint(batch, cached, extend, prefill)


def save_profile(points: list[ProfilePoint], path: str | Path, hits: "list[PrefixHitPoint] | tuple" = ()) -> None:
    table: dict[str, object] = {}
    for p in points:
        table.setdefault(str(p.input_len), {})[str(p.output_len)] = [p.batch_size, p.prefill_s, p.decode_s]
    if hits:
        table[PREFIX_HITS] = [[h.batch_size, h.cached_len, h.extend_len, h.prefill_s] for h in hits]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table))
