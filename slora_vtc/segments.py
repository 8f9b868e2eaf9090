"""Prompts as named segments (a system prompt, a document, a question, a conversation turn),
expanded deterministically into token ids so that requests naming the same segments share that
prefix token for token.

A segment's ids depend only on its name, its length and the vocabulary: a generator seeded by a
stable hash of the name (BLAKE2b, never Python's salted hash()) draws `length` ids in
[FIRST_ID, vocab_size), clear of the special tokens (0 unk, 1 BOS, 2 EOS in Llama's vocabulary).

Text form (CSV and parquet trace files): `name:length` pairs joined by `|`, e.g. `doc7:1200|q3:40`;
a name may hold `:` (the length is after the last one) but not `|`.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy (and hashlib) are imported where ids are drawn: a workload without segments needs neither
    import numpy as np

FIRST_ID = 3
SEPARATOR = "|"

Segments = tuple[tuple[str, int], ...]


def segment_ids(name: str, length: int, vocab_size: int = 32000) -> "np.ndarray":
    """The `length` token ids of segment `name` (int32)."""
    import hashlib

    import numpy as np

    seed = int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(FIRST_ID, vocab_size, size=length, dtype=np.int32)


class SegmentExpander:
    """Expands segment lists into ids, each distinct (name, length) once."""

    def __init__(self, vocab_size: int = 32000):
        if vocab_size <= FIRST_ID:
            raise ValueError(f"vocab_size must exceed {FIRST_ID}, got {vocab_size}")
        self.vocab_size = vocab_size
        self._ids: dict[tuple[str, int], "np.ndarray"] = {}

    def ids(self, name: str, length: int) -> "np.ndarray":
        key = (name, length)
        if key not in self._ids:
            self._ids[key] = segment_ids(name, length, self.vocab_size)
        return self._ids[key]

    def expand(self, segments: Segments, prefix: tuple[int, ...] = ()) -> "np.ndarray":
        """`prefix` ids (a BOS), then every segment's ids in order."""
        import numpy as np

        parts = [np.asarray(prefix, dtype=np.int32)] + [self.ids(n, k) for n, k in segments]
        return np.concatenate(parts)


def format_segments(segments: Segments) -> str:
    """The text form; a name holding the separator cannot be written in it."""
    for name, _ in segments:
        if SEPARATOR in name:
            raise ValueError(f"segment name {name!r} holds '{SEPARATOR}', which the text form cannot carry")
    return SEPARATOR.join(f"{name}:{length}" for name, length in segments)


def parse_segments(value) -> Segments:
    """Segments from the text form or a list of [name, length] pairs; ValueError saying what is wrong."""
    if isinstance(value, str):
        pairs = [_split_pair(piece) for piece in value.split(SEPARATOR)] if value.strip() else []
    elif isinstance(value, (list, tuple)):
        pairs = [_pair(i, item) for i, item in enumerate(value)]
    else:
        raise ValueError(
            f"expected a list of [name, length] pairs or text like 'doc7:1200|q3:40', got {type(value).__name__}"
        )
    return tuple((name, _length(name, length)) for name, length in pairs)


def _split_pair(piece: str) -> tuple[str, str]:
    name, colon, length = piece.rpartition(":")
    if not colon or not name:
        raise ValueError(f"segment {piece!r} is not name:length")
    return name, length


def _pair(index: int, item) -> tuple[str, object]:
    if not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str) or not item[0]:
        raise ValueError(f"segment {index} is not a [name, length] pair: {item!r}")
    return item[0], item[1]


def _length(name: str, value) -> int:
    if isinstance(value, bool):
        raise ValueError(f"segment '{name}' length is not a whole number: {value!r}")
    try:
        length = int(value) if isinstance(value, (int, str)) else None
        if isinstance(value, float) and value.is_integer():
            length = int(value)
    except ValueError:
        length = None
    if length is None:
        raise ValueError(f"segment '{name}' length is not a whole number: {value!r}")
    if length <= 0:
        raise ValueError(f"segment '{name}' length must be positive, got {length}")
    return length
