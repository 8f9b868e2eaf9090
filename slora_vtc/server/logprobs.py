"""Token logprobs in OpenAI's two shapes, as vLLM fills them.

Completions (legacy): {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; each
top_logprobs entry maps the chosen token and then the k most likely to their logprobs (a dict by
token text, so `logprobs: 0` gives the chosen token alone). Chat: {"content": [{"token",
"logprob", "bytes", "top_logprobs": the k most likely, most likely first}]}. A token's text is
its own decoding, or "token_id:ID" when asked for (vLLM's return_tokens_as_token_ids); -inf
becomes -9999.0, OpenAI's stand-in.
"""

from collections.abc import Callable

from slora_vtc.request import TokenLogprob
from slora_vtc.server.tokenizer import Tokenizer

FLOOR = -9999.0
TokenText = Callable[[int], str]


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)


def token_text(tokenizer: Tokenizer, as_ids: bool) -> TokenText:
    return (lambda t: f"token_id:{t}") if as_ids else (lambda t: tokenizer.decode([t]))


class CompletionLogprobs:
    """The legacy object of one choice, delta by delta: text_offset runs on across deltas."""

    def __init__(self, text_of: TokenText, k: int):
        self.text_of, self.k = text_of, k
        self.offset = 0

    def of(self, ids: tuple[int, ...] | list[int], logprobs: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict:
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, lp in zip(ids, logprobs):
            text = self.text_of(token)
            out["tokens"].append(text)
            out["token_logprobs"].append(_value(lp.logprob))
            top = {text: _value(lp.logprob)}
            for other, value in lp.top[: self.k]:
                top.setdefault(self.text_of(other), _value(value))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out


def chat_logprobs(
    text_of: TokenText,
    k: int,
    ids: tuple[int, ...] | list[int],
    logprobs: tuple[TokenLogprob, ...] | list[TokenLogprob],
) -> dict:
    return {
        "content": [
            {
                **_entry(text_of(token), lp.logprob),
                "top_logprobs": [_entry(text_of(other), value) for other, value in lp.top[:k]],
            }
            for token, lp in zip(ids, logprobs)
        ]
    }


def _entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode("utf-8", errors="replace"))}
