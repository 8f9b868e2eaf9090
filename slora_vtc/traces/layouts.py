"""Conversation records in any of the layouts slora_vtc.traces.build describes -> their
single-turn chats, or (for --multi-turn) their alternating exchanges. The layout is detected per
record, by its conversation field."""

import math
from dataclasses import dataclass

from slora_vtc.errors import UserError, json_kind

# a turn's speaker, in every layout's spelling -> user / assistant / system
ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class Layout:
    name: str
    sides: tuple[tuple[str, str], ...]  # (client field, conversation field) of each conversation in a record
    role: str  # the key naming a turn's speaker
    text: str  # the key holding a turn's text
    default_client: str | None = None  # the client when a record lacks its client field; None: the field is required


LAYOUTS = (
    Layout("arena pairwise", (("model_a", "conversation_a"), ("model_b", "conversation_b")), "role", "content"),
    Layout("Chatbot Arena / lmsys-chat-1m", (("model", "conversation"),), "role", "content"),
    Layout("ShareGPT", (("model", "conversations"),), "from", "value", "sharegpt"),
    Layout("messages", (("model", "messages"),), "role", "content", "messages"),
)
EXPECTED_FIELDS = (
    "'conversation' (Chatbot Arena, lmsys-chat-1m), 'conversation_a' and 'conversation_b' (arena pairwise), "
    "'conversations' (ShareGPT) or 'messages' (OpenAI-style)"
)


@dataclass(frozen=True)
class Chat:
    """One user message and its reply; `record` is the index of the record it came from."""

    record: int
    client: str
    prompt: str
    reply: str
    system: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class Conversation:
    """A conversation's exchanges, (user message, assistant reply) in order; `name` is unique in its
    file: c<record number>, plus a / b for the sides of a pairwise record."""

    record: int
    name: str
    client: str
    system: str
    exchanges: tuple[tuple[str, str], ...]


def chats(path, records: list[dict], client_field: str | None = None) -> list[Chat | None]:
    """One entry per conversation (two for a pairwise record); None for one that is not single-turn."""
    return [
        _chat(where, index, rec, client, turns)
        for where, index, rec, _, client, turns in _sides(path, records, client_field)
    ]


def conversations(path, records: list[dict], client_field: str | None = None) -> list[Conversation | None]:
    """One entry per conversation (two for a pairwise record); None for one whose turns do not alternate."""
    out = []
    for _, index, _, side, client, turns in _sides(path, records, client_field):
        shape = alternating_exchanges(turns)
        out.append(None if shape is None else Conversation(index, f"c{index + 1}{side}", client, shape[0], shape[1]))
    return out


def _sides(path, records: list[dict], client_field: str | None):
    """(where, record index, record, side letter, client, turns) of every conversation of every record."""
    for index, rec in enumerate(records):
        where = f"{path}: record {index + 1}"
        layout = detect_layout(where, rec)
        for n, (model_field, conversation_field) in enumerate(layout.sides):
            side = "ab"[n] if len(layout.sides) > 1 else ""
            client = _client(where, rec, layout, model_field, client_field)
            yield (
                where,
                index,
                rec,
                side,
                client,
                _turns(where, layout, conversation_field, rec.get(conversation_field)),
            )


def detect_layout(where: str, rec: dict) -> Layout:
    layout = next((lay for lay in LAYOUTS if lay.sides[0][1] in rec), None)
    if layout is None:
        fields = ", ".join(sorted(map(str, rec))[:12]) or "none"
        raise UserError(f"{where}: no conversation field (it has: {fields}); expected {EXPECTED_FIELDS}")
    return layout


def _client(where: str, rec: dict, layout: Layout, model_field: str, client_field: str | None) -> str:
    field = client_field or model_field
    if rec.get(field) is None:
        if client_field:
            raise UserError(f"{where}: missing field '{client_field}' (named by --client-field)")
        if layout.default_client is None:
            raise UserError(f"{where}: missing field '{model_field}' (the model, which names the client)")
        return layout.default_client
    value = rec[field]
    if isinstance(value, (dict, list, bool)):
        raise UserError(f"{where}: field '{field}' must name a client, got {json_kind(value)}")
    return str(value)


def _turns(where: str, layout: Layout, field: str, conversation) -> list[tuple[str, str]]:
    if conversation is None:
        raise UserError(f"{where}: missing field '{field}' (a {layout.name} record)")
    if not isinstance(conversation, (list, tuple)):
        raise UserError(f"{where}: field '{field}' must be a list of turns, got {json_kind(conversation)}")
    return [_turn(f"{where}: field '{field}' turn {i}", layout, turn) for i, turn in enumerate(conversation, 1)]


def _turn(where: str, layout: Layout, turn) -> tuple[str, str]:
    if not isinstance(turn, dict):
        raise UserError(f"{where} is {json_kind(turn)}, expected an object with '{layout.role}' and '{layout.text}'")
    for key in (layout.role, layout.text):
        if key not in turn:
            raise UserError(f"{where}: missing field '{key}'")
    text = turn[layout.text] if turn[layout.text] is not None else ""
    if not isinstance(text, str):
        raise UserError(f"{where}: field '{layout.text}' must be text, got {json_kind(text)}")
    speaker = str(turn[layout.role]).lower()
    return ROLES.get(speaker, speaker), text


def _chat(where: str, index: int, rec: dict, client: str, turns: list[tuple[str, str]]) -> Chat | None:
    exchange = single_exchange(turns)
    if exchange is None:
        return None
    system, prompt, reply = exchange
    return Chat(
        index,
        client,
        prompt,
        reply,
        system,
        _given_count(where, rec, "prompt_tokens"),
        _given_count(where, rec, "output_tokens"),
    )


def single_exchange(turns: list[tuple[str, str]]) -> tuple[str, str, str] | None:
    """(system, prompt, reply) when the turns are one user message and one reply, after an optional
    leading system message; None otherwise."""
    system = ""
    if turns and turns[0][0] == "system":
        system, turns = turns[0][1], turns[1:]
    if [role for role, _ in turns] != ["user", "assistant"]:
        return None
    return system, turns[0][1], turns[1][1]


def alternating_exchanges(turns: list[tuple[str, str]]) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """(system, exchanges) when, after an optional leading system message, user and assistant
    alternate from the user; a last user message without a reply is left out (it has no output).
    None for any other shape, or no exchange."""
    system = ""
    if turns and turns[0][0] == "system":
        system, turns = turns[0][1], turns[1:]
    if turns and len(turns) % 2 == 1 and turns[-1][0] == "user":
        turns = turns[:-1]
    roles = [role for role, _ in turns]
    if not turns or roles != ["user", "assistant"] * (len(turns) // 2):
        return None
    return system, tuple((turns[i][1], turns[i + 1][1]) for i in range(0, len(turns), 2))


def _given_count(where: str, rec: dict, field: str) -> int | None:
    value = rec.get(field)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise UserError(f"{where}: field '{field}' is not a whole number: {value!r}")
    return int(value)
