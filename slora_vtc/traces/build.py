"""Conversation logs -> our trace format, as the artifact built its trace from Chatbot Arena.

Input: one file of records, a JSON array, JSONL (one record per line) or parquet, any of them
gzip-compressed (`.gz`, recognised by its bytes). A pickle is refused (unpickling can run code).
Messages number records from 1 in file order (in JSONL, blank lines are not records).

Layouts, detected per record by its conversation field (one file may mix them):
  (a) Chatbot Arena: `{"model", "conversation": [{"role", "content"}, ...], "tstamp"}`, and the
      pairwise `{"model_a", "model_b", "conversation_a", "conversation_b", "tstamp"}`, whose two
      sides are two requests;
  (b) lmsys-chat-1m: `{"conversation_id", "model", "conversation": [{"role", "content"}, ...],
      "turn", "language", ...}`, layout (a) without timestamps;
  (c) ShareGPT, `{"conversations": [{"from": "human" | "gpt" | "system" | ..., "value"}, ...]}`,
      and OpenAI-style `{"messages": [{"role", "content"}, ...]}`, each with an optional `model`.
Speakers: user/human are the user; assistant/gpt/chatgpt/bard/bing the assistant.

Clients: a record's `model` (`model_a` / `model_b` for the sides of a pairwise record) names its
client, as in the paper; a ShareGPT record without one is client "sharegpt", a messages record
"messages". `client_field` (`--client-field FIELD`) takes the client from FIELD instead, for every
record (both sides of a pairwise one); every record must then have it.

Steps (docs/design.md, "The trace pipeline"): keep single-turn chats, one user message then one
assistant reply, as the paper did. A leading system message keeps a chat single-turn and is part
of its prompt (its tokens count in prompt_len: a server prefills it); any other shape is dropped.
Prompt and output lengths in tokens (slora_vtc.traces.tokenize, or `prompt_tokens` /
`output_tokens` in the record); drop requests with a length of 0 or >= 1024; sample
rate * duration of the rest at random, without replacement (numpy RandomState(seed)).

Arrivals (`arrivals`, `--arrivals`):
  timestamps: each record's `tstamp` (or `timestamp`): Unix seconds, or an ISO-8601 string read by
      datetime.fromisoformat, naive meaning UTC; the sampled requests' times are mapped linearly
      onto [0, duration]. Every record must have one.
  poisson: timestamps are ignored; the n sampled requests get the order statistics of n
      independent uniform draws on [0, duration] (a Poisson process conditioned on n arrivals),
      drawn from the same RandomState after the sample, and keep the file's record order (the
      first record gets the earliest time).
  auto (the CLI's default): timestamps when every record has one, poisson when none has; a file
      where only some have one is an error naming the first record without.
build_trace's own default is timestamps, the paper's rule.

`--multi-turn` keeps whole conversations instead, each turn a request with the history in its
prompt (as named segments); its rules are in slora_vtc.traces.multi_turn.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from slora_vtc.errors import UserError, json_kind
from slora_vtc.progress import tracked
from slora_vtc.traces.arrivals import arrival_rule, poisson_times, record_times, rescaled
from slora_vtc.traces.files import decode_text, is_parquet, is_pickle, json_lines, parquet_rows, read_input
from slora_vtc.traces.layouts import Chat, chats
from slora_vtc.traces.multi_turn import DEFAULT_THINK_TIME_S, MultiTurnStats, build_multi_turn
from slora_vtc.traces.tokenize import Counter
from slora_vtc.workload import RequestSpec

__all__ = ["MAX_LEN", "BuildStats", "Chat", "build_trace", "chats", "load_raw"]

MAX_LEN = 1024
MAX_SEED = 2**32 - 1
RAW_FORMATS = "trace build reads JSON, JSONL or parquet conversation logs, optionally .gz"


@dataclass(frozen=True)
class BuildStats:
    records: int
    single_turn: int
    too_long: int  # single-turn chats dropped for a length of 0 or >= MAX_LEN
    sampled: int
    clients: int
    wanted: int  # rate * duration
    arrivals: str  # the rule used: "timestamps" or "poisson"


class Sized(NamedTuple):
    chat: Chat
    prompt_len: int
    output_len: int


def load_raw(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    data = read_input(path, "give one file of conversation logs (JSON, JSONL or parquet, optionally .gz)")
    if is_pickle(data):
        raise UserError(
            f"{path}: is a Python pickle, which trace build does not read (unpickling can run code); {RAW_FORMATS}"
        )
    if is_parquet(path, data):
        return parquet_rows(path, data)
    return _objects(path, _json_records(path, decode_text(path, data, RAW_FORMATS)))


def _json_records(path: Path, text: str) -> list:
    if text.lstrip().startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # "Extra data": JSONL whose first record is a list, reported per line below
                raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    return [record for _, record in json_lines(path, text)]


def _objects(path: Path, records: list) -> list[dict]:
    for n, rec in enumerate(records, 1):
        if not isinstance(rec, dict):
            raise UserError(f"{path}: record {n}: expected an object (a conversation record), got {json_kind(rec)}")
    return records


def requested_count(rate: float, duration: float) -> int:
    if not (math.isfinite(rate) and math.isfinite(duration) and rate > 0 and duration > 0):
        raise UserError(f"--rate and --duration must be positive (got {rate}, {duration})")
    wanted = math.floor(round(rate * duration, 6))  # 0.29 * 100 is 28.999999999999996: still 29
    if wanted < 1:
        raise UserError(
            f"--rate x --duration asks for 0 requests (rate {rate:g} x duration {duration:g} s); ask for at least 1"
        )
    return wanted


def check_seed(seed: int) -> None:
    """numpy's RandomState takes seeds in [0, 2**32 - 1]."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed must be a whole number from 0 to {MAX_SEED} (2**32 - 1), got {seed}")


def build_trace(
    path: str,
    rate: float,
    duration: float,
    count_tokens: Counter,
    bos: int = 1,
    seed: int = 42,
    arrivals: str = "timestamps",
    client_field: str | None = None,
    multi_turn: bool = False,
    think_time: float = DEFAULT_THINK_TIME_S,
    progress: bool = False,
) -> tuple[list[RequestSpec], "BuildStats | MultiTurnStats"]:
    """The sampled requests and what was kept; `multi_turn`: every turn of whole conversations
    (traces/multi_turn.py); `progress`: a bar of the conversations sized, once that has lasted a second."""
    wanted = requested_count(rate, duration)
    check_seed(seed)
    if not (math.isfinite(think_time) and think_time >= 0):
        raise UserError(f"--think-time must be a finite number of seconds >= 0, got {think_time}")
    raw = load_raw(path)
    if not raw:
        raise UserError(f"{path}: no records")
    rule = arrival_rule(path, raw, arrivals)
    times = record_times(path, raw) if rule == "timestamps" else None
    if multi_turn:
        return build_multi_turn(
            path,
            raw,
            wanted,
            duration,
            times,
            count_tokens,
            bos,
            np.random.RandomState(seed),
            client_field,
            think_time,
            rule,
            progress,
        )
    single = [c for c in chats(path, raw, client_field) if c is not None]
    kept = [
        s
        for s in (_sized(c, count_tokens, bos) for c in tracked(single, "token counts", "chat", progress))
        if 0 < s.prompt_len < MAX_LEN and 0 < s.output_len < MAX_LEN
    ]
    if not kept:
        raise UserError(
            f"{path}: no single-turn conversation with both lengths under {MAX_LEN} tokens "
            f"({len(single)} single-turn of {len(raw)} records)"
        )
    rng = np.random.RandomState(seed)
    sample = [kept[i] for i in sorted(rng.choice(len(kept), size=min(wanted, len(kept)), replace=False))]
    records = _arrive(sample, times, duration, rng)
    stats = BuildStats(
        len(raw), len(single), len(single) - len(kept), len(records), len({r.client for r in records}), wanted, rule
    )
    return records, stats


def _arrive(
    sample: list[Sized], times: list[float] | None, duration: float, rng: np.random.RandomState
) -> list[RequestSpec]:
    """The sample (in record order) as requests in arrival order: by timestamps, or poisson when `times` is None."""
    if times is None:
        when = poisson_times(len(sample), duration, rng)
    else:
        sample = sorted(sample, key=lambda s: times[s.chat.record])  # stable: ties keep record order
        when = rescaled([times[s.chat.record] for s in sample], duration)
    return [RequestSpec(s.chat.client, s.prompt_len, s.output_len, t) for s, t in zip(sample, when)]


def _sized(chat: Chat, count_tokens: Counter, bos: int) -> Sized:
    prompt = (
        chat.prompt_tokens
        if chat.prompt_tokens is not None
        else bos + count_tokens(chat.system) + count_tokens(chat.prompt)
    )
    output = chat.output_tokens if chat.output_tokens is not None else count_tokens(chat.reply)
    return Sized(chat, prompt, output)
