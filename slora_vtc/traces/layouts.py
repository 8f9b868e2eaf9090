"""Conversation records in any of the layouts slora_vtc.traces.build describes -> their
single-turn chats. The layout is detected per record, by its conversation field."""

import math
from dataclasses import dataclass

from slora_vtc.errors import UserError
from slora_vtc.traces.files import json_kind

# a turn's speaker, in every layout's spelling -> user / assistant / system
ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "system": "system"}


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
EXPECTED_FIELDS = ("'conversation' (Chatbot Arena, lmsys-chat-1m), 'conversation_a' and 'conversation_b' (arena pairwise), "
                   "'conversations' (ShareGPT) or 'messages' (OpenAI-style)")


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


def chats(path, records: list[dict], client_field: str | None = None) -> list[Chat | None]:
    """One entry per conversation (two for a pairwise record); None for one that is not single-turn."""
    out = []
    for index, rec in enumerate(records):
        where = f"{path}: record {index + 1}"
        layout = detect_layout(where, rec)
        for model_field, conversation_field in layout.sides:
            client = _client(where, rec, layout, model_field, client_field)
            turns = _turns(where, layout, conversation_field, rec.get(conversation_field))
            out.append(_chat(where, index, rec, client, turns))
    return out


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
    return Chat(index, client, prompt, reply, system, _given_count(where, rec, "prompt_tokens"), _given_count(where, rec, "output_tokens"))


def single_exchange(turns: list[tuple[str, str]]) -> tuple[str, str, str] | None:
    """(system, prompt, reply) when the turns are one user message and one reply, after an optional
    leading system message; None otherwise."""
    system = ""
    if turns and turns[0][0] == "system":
        system, turns = turns[0][1], turns[1:]
    if [role for role, _ in turns] != ["user", "assistant"]:
        return None
    return system, turns[0][1], turns[1][1]


def _given_count(where: str, rec: dict, field: str) -> int | None:
    value = rec.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise UserError(f"{where}: field '{field}' is not a whole number: {value!r}")
    return int(value)
