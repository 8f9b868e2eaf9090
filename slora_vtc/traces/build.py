"""Chatbot Arena conversation logs -> our trace format, as the artifact built its trace.

Input records (JSON array, JSONL or parquet) in the public dataset layouts: either
`{"model", "conversation": [{"role", "content"}, ...], "tstamp"}` (one model per record) or the
arena's pairwise `{"model_a", "model_b", "conversation_a", "conversation_b", "tstamp"}` (each side
is one request). Steps (docs/design.md, "The trace pipeline"): keep single-turn chats (one user message, one
assistant reply); the model name is the client; prompt and output lengths in tokens; drop
requests with either length >= 1024; sample rate * duration requests at random (seeded); map
their timestamps linearly onto [0, duration].
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slora_vtc.errors import UserError
from slora_vtc.workload import RequestSpec
from slora_vtc.traces.tokenize import Counter

MAX_LEN = 1024
TIME_FIELDS = ("tstamp", "timestamp")


@dataclass(frozen=True)
class Chat:
    model: str
    prompt: str | None
    reply: str | None
    tstamp: float
    prompt_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class BuildStats:
    records: int
    single_turn: int
    too_long: int
    sampled: int
    clients: int


def load_raw(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            rows = pd.read_parquet(path).to_dict("records")
        except Exception as e:  # pyarrow raises many types for a bad file
            raise UserError(f"{path}: cannot read parquet ({e})") from None
        return [{k: v for k, v in row.items() if not _is_missing(v)} for row in rows]
    text = path.read_text()
    if text.lstrip().startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return records


def _is_missing(value) -> bool:
    """Parquet fills a column a record lacks with None or NaN."""
    return value is None or (isinstance(value, float) and value != value)


def chats(path: str, records: list[dict]) -> list[Chat | None]:
    """One entry per conversation side; None for a multi-turn or malformed conversation."""
    out = []
    for n, rec in enumerate(records, 1):
        tstamp = next((rec[f] for f in TIME_FIELDS if rec.get(f) is not None), None)
        if tstamp is None:
            raise UserError(f"{path}: record {n}: missing field 'tstamp'")
        sides = [("model_a", "conversation_a"), ("model_b", "conversation_b")] if "model_a" in rec else [("model", "conversation")]
        for model_field, conv_field in sides:
            if model_field not in rec:
                raise UserError(f"{path}: record {n}: missing field '{model_field}'")
            out.append(_single_turn(rec, rec[model_field], rec.get(conv_field), float(tstamp)))
    return out


def _single_turn(rec: dict, model: str, conversation, tstamp: float) -> Chat | None:
    if conversation is None or len(conversation) != 2:
        return None
    user, reply = conversation
    if user.get("role") != "user" or reply.get("role") != "assistant":
        return None
    return Chat(str(model), user.get("content"), reply.get("content"), tstamp, rec.get("prompt_tokens"), rec.get("output_tokens"))


def build_trace(path: str, rate: float, duration: float, count_tokens: Counter, bos: int = 1, seed: int = 42) -> tuple[list[RequestSpec], BuildStats]:
    if rate <= 0 or duration <= 0:
        raise UserError(f"--rate and --duration must be positive (got {rate}, {duration})")
    raw = load_raw(path)
    sides = chats(path, raw)
    single = [c for c in sides if c is not None]
    sized = [(c, *_lengths(c, count_tokens, bos)) for c in single]
    kept = [(c, p, o) for c, p, o in sized if 0 < p < MAX_LEN and 0 < o < MAX_LEN]
    wanted = int(rate * duration)
    if not kept:
        raise UserError(f"{path}: no single-turn conversation with both lengths under {MAX_LEN} tokens")
    rng = np.random.RandomState(seed)
    chosen = sorted(rng.choice(len(kept), size=min(wanted, len(kept)), replace=False), key=lambda i: (kept[i][0].tstamp, i))
    start, end = kept[chosen[0]][0].tstamp, kept[chosen[-1]][0].tstamp
    scale = duration / (end - start) if end > start else 0.0
    records = [RequestSpec(kept[i][0].model, kept[i][1], kept[i][2], (kept[i][0].tstamp - start) * scale) for i in chosen]
    stats = BuildStats(len(raw), len(single), len(single) - len(kept), len(records), len({r.client for r in records}))
    return records, stats


def _lengths(chat: Chat, count_tokens: Counter, bos: int) -> tuple[int, int]:
    prompt = chat.prompt_tokens if chat.prompt_tokens is not None else bos + count_tokens(chat.prompt or "")
    output = chat.output_tokens if chat.output_tokens is not None else count_tokens(chat.reply or "")
    return int(prompt), int(output)
