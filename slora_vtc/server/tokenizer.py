"""Text <-> token ids for the server, offline (no download, ever).

A Hugging Face model folder brings its own tokenizer (AutoTokenizer with local files only). A
spec name (dummy weights) uses the byte-level tokenizer shipped here: one id per UTF-8 byte,
offset by 3 when the vocabulary has room (Llama's byte-fallback tokens <0x00>..<0xFF> are ids
3..258, so the same ids mean the same bytes to a real Llama model), the spec's BOS and EOS as
the special tokens. Decoding skips the specials and replaces invalid UTF-8.
"""

from abc import ABC, abstractmethod
from pathlib import Path

from slora_vtc.errors import UserError
from slora_vtc.hf_tokenizer import load_hf_tokenizer
from slora_vtc.model.spec import ModelSpec, is_folder

BYTES = 256
LLAMA_BYTE_OFFSET = 3
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
Message = tuple[str, str]  # (role, content)


class Tokenizer(ABC):
    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """A prompt's ids, BOS included."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """Text of generated ids, special tokens skipped."""

    def chat_prompt(self, messages: list[Message]) -> list[int]:
        """A chat as one prompt, ending where the assistant's answer starts."""
        return self.encode(plain_chat(messages))


def plain_chat(messages: list[Message]) -> str:
    """The chat layout for tokenizers without a chat template of their own."""
    return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"


class ByteTokenizer(Tokenizer):
    def __init__(self, spec: ModelSpec):
        if spec.vocab_size < BYTES:
            raise UserError(
                f"model '{spec.name}': a vocabulary of {spec.vocab_size} cannot hold the byte tokenizer (256 ids); "
                "pass --tokenizer"
            )
        self.offset = min(LLAMA_BYTE_OFFSET, spec.vocab_size - BYTES)
        self.bos_id = spec.bos_token_id
        self.specials = {spec.bos_token_id, *spec.eos_token_ids}

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *(b + self.offset for b in text.encode("utf-8"))]

    def decode(self, ids: list[int]) -> str:
        raw = bytes(i - self.offset for i in ids if i not in self.specials and 0 <= i - self.offset < BYTES)
        return raw.decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    def __init__(self, folder: Path):
        self._tok = load_hf_tokenizer(folder)
        self._backend_decode = _backend_decode(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True))

    def decode(self, ids: list[int]) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(ids, skip_special_tokens=True)
        return self._tok.decode(ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[Message]) -> list[int]:
        if not getattr(self._tok, "chat_template", None):
            return super().chat_prompt(messages)
        chat = [{"role": role, "content": content} for role, content in messages]
        text = self._tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return list(self._tok.encode(text, add_special_tokens=False))  # the template writes BOS itself


def _backend_decode(tok):
    """The `tokenizers` library's decode where transformers' decode of `tok` is exactly that call (a fast tokenizer
    that neither overrides decoding nor cleans up spaces): the same text without transformers' per-call wrapping,
    which cost as much again (twice per streamed token: IncrementalDecoder). None otherwise."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    cls = type(tok)
    plain = cls.decode is PreTrainedTokenizerBase.decode and cls._decode is TokenizersBackend._decode
    if not plain or getattr(tok, "clean_up_tokenization_spaces", True):
        return None
    return tok.backend_tokenizer.decode


def load_tokenizer(model: str, spec: ModelSpec, path: str | None = None) -> Tokenizer:
    """`path` if given (a tokenizer folder, or `byte`); else the model folder's tokenizer, or bytes."""
    if path == "byte":
        return ByteTokenizer(spec)
    if path is not None:
        return HFTokenizer(Path(path))
    if is_folder(model) and any((Path(model) / name).is_file() for name in TOKENIZER_FILES):
        return HFTokenizer(Path(model))
    return ByteTokenizer(spec)


class IncrementalDecoder:
    """Text deltas of a growing id sequence, never splitting a character across deltas.

    Decodes a short window (the ids since the last emitted prefix), so a long output costs linear
    time; a window ending in U+FFFD is an incomplete character and waits for more ids.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the decoding window
        self._read = 0  # ids before this are already emitted

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        done = self.tokenizer.decode(self.ids[self._prefix : self._read])
        text = self.tokenizer.decode(self.ids[self._prefix :])
        if text.endswith("\ufffd") or len(text) <= len(done):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(done) :]

    def flush(self) -> str:
        """Whatever is left at the end, incomplete characters included (as U+FFFD)."""
        done = self.tokenizer.decode(self.ids[self._prefix : self._read])
        text = self.tokenizer.decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return text[len(done) :]
