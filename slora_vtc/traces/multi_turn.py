"""`trace build --multi-turn`: conversations kept whole, each user turn a request whose prompt is
the history plus the new message (the paper's pipeline keeps single-turn chats only).

Conversations: after an optional system message, user and assistant alternate from the user
(a last user message without a reply is left out: it has no output); any other shape is dropped.
Turn k of conversation CONV (c<record number>, plus a / b for a pairwise record's sides) is one
request: segments `bos` (the BOS, 1 token), `CONV/system`, `CONV/u0`, `CONV/a0`, ..., `CONV/uk`
with their token counts (empty messages have no segment), output = the reply a_k. Every message is
counted from its text: a record's `prompt_tokens` / `output_tokens` describe one exchange, so
they are not used here.

The 1024-token filter applies per turn: a turn is kept when its prompt (history and message) and
its reply are each between 1 and 1023 tokens. Later turns keep the whole history, dropped turns
included, so once a prompt reaches 1024 tokens the rest of its conversation goes too.

Sampling: `rate * duration` counts turns (requests), as in the single-turn pipeline. Conversations
with a kept turn are drawn in a random order (RandomState(seed).permutation), whole, until their
turns reach that count; the last one drawn keeps only its first turns, so the count is exact.

Arrivals: a conversation's first kept turn arrives by the arrival rule (slora_vtc.traces.build),
applied to the drawn conversations in record order: its record's timestamp, mapped linearly onto
[0, duration], or a seeded uniform time. Each later kept turn arrives `think_time` seconds after
the previous one (a fixed think time: the reply read, the next message typed), so a trace may run
past `duration` by (turns - 1) * think_time.
"""

from dataclasses import dataclass

import numpy as np

from slora_vtc.errors import UserError
from slora_vtc.progress import tracked
from slora_vtc.traces.arrivals import poisson_times, rescaled
from slora_vtc.traces.layouts import Conversation, conversations
from slora_vtc.traces.tokenize import Counter
from slora_vtc.workload import RequestSpec

MAX_LEN = 1024  # as slora_vtc.traces.build.MAX_LEN
DEFAULT_THINK_TIME_S = 10.0


@dataclass(frozen=True)
class Turn:
    segments: tuple[tuple[str, int], ...]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return sum(n for _, n in self.segments)


@dataclass(frozen=True)
class MultiTurnStats:
    records: int
    conversations: int  # with alternating turns
    turns: int  # their turns, before the length filter
    too_long: int  # turns dropped for a length of 0 or >= MAX_LEN
    sampled: int  # turns written
    sampled_conversations: int
    clients: int
    wanted: int
    arrivals: str


def build_multi_turn(
    path,
    raw: list[dict],
    wanted: int,
    duration: float,
    times: list[float] | None,
    count_tokens: Counter,
    bos: int,
    rng: np.random.RandomState,
    client_field: str | None,
    think_time: float,
    rule: str,
    progress: bool = False,
) -> tuple[list[RequestSpec], MultiTurnStats]:
    if not think_time >= 0:
        raise UserError(f"--think-time must be a number of seconds >= 0, got {think_time}")
    convs = [c for c in conversations(path, raw, client_field) if c is not None]
    all_turns = [conversation_turns(c, count_tokens, bos) for c in tracked(convs, "token counts", "conv", progress)]
    kept = [
        (c, [t for t in turns if 0 < t.prompt_len < MAX_LEN and 0 < t.output_len < MAX_LEN])
        for c, turns in zip(convs, all_turns)
    ]
    kept = [(c, turns) for c, turns in kept if turns]
    if not kept:
        raise UserError(
            f"{path}: no conversation turn with both lengths under {MAX_LEN} tokens "
            f"({len(convs)} conversations of {len(raw)} records)"
        )
    drawn = _draw(kept, wanted, rng)
    specs = _arrive(drawn, times, duration, rng, think_time)
    total = sum(len(t) for t in all_turns)
    stats = MultiTurnStats(
        len(raw),
        len(convs),
        total,
        total - sum(len(t) for _, t in kept),
        len(specs),
        len(drawn),
        len({s.client for s in specs}),
        wanted,
        rule,
    )
    return specs, stats


def conversation_turns(conv: Conversation, count_tokens: Counter, bos: int) -> list[Turn]:
    """Every exchange of the conversation as a turn: the history and its message, then its reply."""
    history = [("bos", bos), (f"{conv.name}/system", count_tokens(conv.system))]
    turns = []
    for k, (message, reply) in enumerate(conv.exchanges):
        history.append((f"{conv.name}/u{k}", count_tokens(message)))
        output = count_tokens(reply)
        turns.append(Turn(tuple((n, length) for n, length in history if length > 0), output))
        history.append((f"{conv.name}/a{k}", output))
    return turns


def _draw(
    kept: list[tuple[Conversation, list[Turn]]], wanted: int, rng: np.random.RandomState
) -> list[tuple[Conversation, list[Turn]]]:
    """Whole conversations in a random order until `wanted` turns (the last one cut), back in record order."""
    drawn, count = [], 0
    for i in rng.permutation(len(kept)):
        if count >= wanted:
            break
        conv, turns = kept[i]
        drawn.append((i, conv, turns[: wanted - count]))
        count += len(drawn[-1][2])
    return [(conv, turns) for _, conv, turns in sorted(drawn, key=lambda d: d[0])]


def _arrive(
    drawn, times: list[float] | None, duration: float, rng: np.random.RandomState, think_time: float
) -> list[RequestSpec]:
    if times is None:
        starts = poisson_times(len(drawn), duration, rng)
    else:
        drawn = sorted(drawn, key=lambda d: times[d[0].record])  # stable: ties keep record order
        starts = rescaled([times[conv.record] for conv, _ in drawn], duration)
    specs = [
        RequestSpec(conv.client, t.prompt_len, t.output_len, start + k * think_time, t.segments)
        for (conv, turns), start in zip(drawn, starts)
        for k, t in enumerate(turns)
    ]
    return sorted(specs, key=lambda s: s.arrival)
