"""The whole OpenAI answer of a request that did not stream, re-assembled from the stream the
gateway asked for instead (so that its tokens are charged while they are produced).

Per choice index: the text (chat: the assistant's message, its `content` and any reasoning text
concatenated), the last finish_reason and vLLM's stop_reason, and the logprobs' lists
concatenated (completions: tokens, token_logprobs, top_logprobs, text_offset, whose streamed
offsets already run on across chunks; chat: content). `usage` is the last chunk's that has one;
id, created, model and system_fingerprint come from the chunks.

Only requests whose whole answer is exactly the sum of its chunks take this path (`assembles`):
every field one the gateway knows does not change that (OpenAI's and vLLM's sampling fields),
no tools (tool calls arrive as fragments), no best_of above n (it cannot be streamed), no echo
with logprobs (vLLM streams the prompt's offsets differently from its whole answer), no
stream_options (the upstream refuses them without `stream`). A chunk that still carries
something not understood here ends the request with `Unassembled` rather than a wrong answer.
"""

ENVELOPE = ("id", "created", "model", "system_fingerprint", "service_tier")
SAMPLING_FIELDS = frozenset(
    {
        "model",
        "user",
        "stream",
        "n",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "response_format",
        # vLLM's extra sampling and decoding fields
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "allowed_token_ids",
        "bad_words",
        "add_special_tokens",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "priority",
        "return_tokens_as_token_ids",
    }
)
COMPLETION_FIELDS = SAMPLING_FIELDS | {"prompt", "echo", "logprobs", "best_of"}
CHAT_FIELDS = SAMPLING_FIELDS | {
    "messages",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "metadata",
    "store",
    "reasoning_effort",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
}
COMPLETION_CHOICE = frozenset({"index", "text", "logprobs", "finish_reason", "stop_reason"})
CHAT_CHOICE = frozenset({"index", "delta", "logprobs", "finish_reason", "stop_reason"})
CHAT_TEXT = ("content", "reasoning_content", "reasoning", "refusal")  # delta fields that are text, concatenated


class Unassembled(ValueError):
    """A chunk carries something whose whole form is not known here."""


def assembles(body: dict, chat: bool) -> bool:
    """Whether a request that does not stream can be sent as a stream and answered whole."""
    if not set(body) <= (CHAT_FIELDS if chat else COMPLETION_FIELDS):
        return False
    if chat:
        return True
    best_of, n = body.get("best_of"), body.get("n") or 1
    return best_of in (None, n) and not (body.get("echo") and body.get("logprobs") is not None)


class _Choice:
    """One choice, chunk by chunk."""

    def __init__(self, chat: bool):
        self.chat = chat
        self.text: dict[
            str, list[str]
        ] = {}  # completions: "text"; chat: the message's text fields; pieces, joined at the end
        self.role = "assistant"
        self.logprobs: dict | None = None
        self.finish_reason = None
        self.stop_reason, self.has_stop_reason = None, False

    def add(self, choice: dict) -> None:
        _only(choice, CHAT_CHOICE if self.chat else COMPLETION_CHOICE, "choice")
        if self.chat:
            self._delta(choice.get("delta") or {})
        elif choice.get("text") is not None:
            self._append("text", choice["text"])
        if choice.get("logprobs") is not None:
            self._logprobs(choice["logprobs"])
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if "stop_reason" in choice:
            self.has_stop_reason = True
            if choice["stop_reason"] is not None:
                self.stop_reason = choice["stop_reason"]

    def _delta(self, delta: dict) -> None:
        if not isinstance(delta, dict):
            raise Unassembled("a chat chunk's delta is not an object")
        for key, value in delta.items():
            if key == "role" and isinstance(value, str):
                self.role = value
            elif key in CHAT_TEXT and isinstance(value, str):
                self._append(key, value)
            elif value not in (None, []):  # tool_calls, function_call, or anything else
                raise Unassembled(f"a chat chunk carries '{key}'")

    def _append(self, key: str, text: str) -> None:
        if not isinstance(text, str):
            raise Unassembled(f"a chunk's '{key}' is not text")
        self.text.setdefault(key, []).append(text)

    def _logprobs(self, logprobs: dict) -> None:
        if not isinstance(logprobs, dict):
            raise Unassembled("a chunk's logprobs is not an object")
        merged = self.logprobs if self.logprobs is not None else {}
        for key, value in logprobs.items():
            if isinstance(value, list):
                if merged.get(key) is None:
                    merged[key] = []
                merged[key].extend(value)
            elif value is None:
                merged.setdefault(key, None)
            else:
                raise Unassembled(f"a chunk's logprobs.{key} is not a list")
        self.logprobs = merged

    def whole(self, index: int) -> dict:
        text = {key: "".join(pieces) for key, pieces in self.text.items()}
        if self.chat:
            message = {
                "role": self.role,
                "content": text.get("content"),
                **{key: text[key] for key in CHAT_TEXT[1:] if key in text},
            }
            body = {"index": index, "message": message}
        else:
            body = {"index": index, "text": text.get("text", "")}
        body.update(logprobs=self.logprobs, finish_reason=self.finish_reason)
        if self.has_stop_reason:
            body["stop_reason"] = self.stop_reason
        return body


def _only(fields: dict, known: frozenset, what: str) -> None:
    unknown = next((key for key, value in fields.items() if key not in known and value is not None), None)
    if unknown is not None:
        raise Unassembled(f"a chunk's {what} carries '{unknown}'")


class Assembled:
    """The whole answer of one request, from its stream's chunks (`add` each, then `result`)."""

    def __init__(self, chat: bool):
        self.chat = chat
        self.envelope: dict = {}
        self.choices: dict[int, _Choice] = {}
        self.usage: dict | None = None

    def add(self, chunk: dict) -> None:
        for key in ENVELOPE:
            if chunk.get(key) is not None:
                self.envelope.setdefault(key, chunk[key])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise Unassembled("a chunk's choices is not a list")
        for choice in choices:
            index = choice.get("index") if isinstance(choice, dict) else None
            if not isinstance(index, int) or isinstance(index, bool):
                raise Unassembled("a chunk's choice has no index")
            if index not in self.choices:
                self.choices[index] = _Choice(self.chat)
            self.choices[index].add(choice)

    def result(self) -> dict:
        envelope = dict(self.envelope)
        head = {
            "id": envelope.pop("id", None),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": envelope.pop("created", None),
            "model": envelope.pop("model", None),
        }
        choices = [self.choices[i].whole(i) for i in sorted(self.choices)]
        return {**head, **envelope, "choices": choices, "usage": self.usage}
