"""Request bodies of the HTTP API: OpenAI completions and chat, S-LoRA's /generate.

Unknown fields are ignored (clients send many); fields that would change the output in a way
this server does not implement (n > 1, stop strings, logprobs, ...) are refused by name. Values
are not coerced: `"max_tokens": "16"` and `"stream": "yes"` are refused, as is text that is not
valid Unicode (a lone surrogate) and a prompt nested deeper than a list of token-id lists.
"""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

Prompt = str | list[int]

# field -> values that mean "not used"; anything else is refused (None is always fine)
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (False, 0), "top_logprobs": (0,),
    "suffix": ("",), "logit_bias": ({},), "stop": ("", []), "presence_penalty": (0,),
    "frequency_penalty": (0,), "seed": (), "tools": ([],), "response_format": ({"type": "text"},),
    # vLLM's extensions that change the output
    "stop_token_ids": ([],), "min_p": (0,), "min_tokens": (0,), "repetition_penalty": (1,),
}


STRICT = ConfigDict(strict=True)  # no coercion: "16" is not an int, "yes" is not a bool


def valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
    return text


UnicodeText = Annotated[str, AfterValidator(valid_unicode)]  # text a tokenizer can encode


def is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _single_prompt(value: Any) -> Any:
    """One prompt: a string or a list of token ids."""
    if isinstance(value, str):
        return valid_unicode(value)
    if is_token_ids(value):
        return value
    raise ValueError("must be a string or a list of token ids")


def _text_or_ids(value: Any) -> Any:
    """A clear message for a prompt of the wrong type (instead of one error per union member)."""
    if isinstance(value, str):
        return valid_unicode(value)
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    if isinstance(value, list) and all(isinstance(t, str | list) for t in value):
        return value
    raise ValueError("must be a string or a list of token ids")


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class OpenAIParams(BaseModel):
    """Fields shared by completions and chat."""

    model_config = STRICT
    model: str | None = None  # any name: this server serves one model
    max_tokens: int | None = Field(None, gt=0)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # extension (vLLM's): 0 or -1 is off
    ignore_eos: bool = False  # extension: generate exactly max_tokens tokens
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, unused in UNSUPPORTED.items():
                value = data.get(name)
                if value is not None and not any(value == u and isinstance(value, bool) == isinstance(u, bool) for u in unused):
                    raise ValueError(f"'{name}' is not supported by this server (got {value!r})")
        return data

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(OpenAIParams):
    prompt: str | list[int] | list[str] | list[list[int]]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value):
        value = _text_or_ids(value)
        if isinstance(value, list) and value and isinstance(value[0], str | list):
            if len(value) != 1:
                raise ValueError("one prompt per request (batched prompts are not supported)")
            return _single_prompt(value[0])
        return value


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: UnicodeText


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: UnicodeText | list[TextPart] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(OpenAIParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0)  # the newer name of max_tokens


class GenerateParameters(BaseModel):
    """S-LoRA's sampling parameters (do_sample false: greedy)."""

    model_config = STRICT
    max_new_tokens: int = Field(16, gt=0)
    do_sample: bool = False
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    ignore_eos: bool = False


class GenerateRequest(BaseModel):
    inputs: Prompt

    @field_validator("inputs", mode="before")
    @classmethod
    def _prompt(cls, value):
        return _single_prompt(value)
    parameters: GenerateParameters = GenerateParameters()
    lora_dir: str | None = None  # S-LoRA names the adapter by its folder; here: the adapter's name
