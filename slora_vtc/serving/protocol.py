"""Request bodies of the HTTP API: OpenAI completions and chat, S-LoRA's /generate.

Unknown fields are ignored (clients send many); fields that would change the output in a way
this server does not implement (suffix, logit_bias, tools, min_p, ...) are refused by name. Values
are not coerced: `"max_tokens": "16"` and `"stream": "yes"` are refused, as is text that is not
valid Unicode (a lone surrogate) and a prompt nested deeper than a list of token-id lists; but a
number with no fraction is an integer (`16.0` is 16), as JSON Schema and vLLM count it.

The JSON schema of each body (the server's /openapi.json) states every rule a single field has and
the refused fields' only accepted values; the rules between fields (comparisons, token counts, and
echo without logprobs, kept out of `if`/`then`, which generators of bodies from schemas mishandle)
are in each body's description. What depends on the served model is marked here (TOKEN_ID, NEW_TOKENS, MODEL_NAME,
ADAPTER_NAME) and filled in by the server (server/openapi.py).
"""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from slora_vtc.model.sampling_params import MAX_LOGPROBS, SEED_RANGE

Prompt = str | list[int]

# field -> values that mean "not used"; anything else is refused (None is always fine)
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "suffix": ("",),
    "logit_bias": ({},),
    "tools": ([],),
    "response_format": ({"type": "text"},),
    # vLLM's extensions that change the output
    "min_p": (0,),
    "min_tokens": (0,),
}
CHAT_UNSUPPORTED = {**UNSUPPORTED, "best_of": (1,), "echo": (False,)}  # completions only
MAX_STOP_STRINGS = 4  # OpenAI's limit
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for completions
# chat has no default (up to the context): the server caps what one request reserves at this, the gateway assumes it
CHAT_DEFAULT_MAX_TOKENS = 256
MAX_SEQUENCES = 64  # prompts x best_of (or n) in one request


def integral(value: Any) -> Any:
    """A float with no fraction as the integer it is (16.0 -> 16); anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def Int(**bounds: int) -> Any:
    """An integer within `bounds` (Field's ge, gt, le, lt), 16.0 taken as 16; strict otherwise ("16" and true are
    not integers). The bounds come before the validator, so that the JSON schema states them even in a union."""
    return Annotated[int, Field(**bounds), BeforeValidator(integral)]


# markers the server's schema replaces with the served model's numbers and names (server/openapi.py)
TOKEN_ID = "x-token-id"  # an id of the model's vocabulary: 0 .. vocab - 1
NEW_TOKENS = "x-new-tokens"  # new tokens for one request: at most what a one-token prompt could get
MODEL_NAME = "x-model-name"  # one of the names the server serves (base model and adapters)
ADAPTER_NAME = "x-adapter-name"  # one of the server's LoRA adapters


def _marked(marker: str, **schema: Any) -> Any:
    return Field(json_schema_extra={marker: True, **schema})


TokenId = Annotated[Int(), _marked(TOKEN_ID, minimum=0)]  # the server checks the range, naming the vocabulary
TokenIds = Annotated[list[TokenId], Field(json_schema_extra={"minItems": 1})]  # a prompt: at least one token
NewTokens = Annotated[Int(gt=0), _marked(NEW_TOKENS)]
Logprobs = Int(ge=0, le=MAX_LOGPROBS)
ModelName = Annotated[str, _marked(MODEL_NAME)]


def _schema_rules(schema: dict[str, Any], cls: type) -> None:
    """A body's JSON schema: null allowed where it means "not given", each refused field with its only accepted
    values, and `cls.schema_rules`."""
    if getattr(cls, "null_is_unset", False):
        for name, prop in schema["properties"].items():
            if name not in schema.get("required", ()) and {"type": "null"} not in prop.get("anyOf", ()):
                schema["properties"][name] = {"anyOf": [prop, {"type": "null"}]}
    for name, unused in getattr(cls, "unsupported", {}).items():
        accepted = [{"const": u} for u in unused] + [{"type": "null"}]
        schema["properties"][name] = {"anyOf": accepted, "description": "not supported by this server"}
    schema.update(getattr(cls, "schema_rules", {}))


STRICT = ConfigDict(strict=True, json_schema_extra=_schema_rules)  # no coercion: "16" is not an int, "yes" no bool


def valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from None
    return text


UnicodeText = Annotated[str, AfterValidator(valid_unicode)]  # text a tokenizer can encode


def is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(integral(t), int) and not isinstance(t, bool) for t in value)


def token_ids(value: list) -> list[int]:
    """A list that is_token_ids, as ints."""
    return [integral(t) for t in value]


def _single_prompt(value: Any) -> Any:
    """One prompt: a string or a list of token ids."""
    if isinstance(value, str):
        return valid_unicode(value)
    if is_token_ids(value):
        return token_ids(value)
    raise ValueError("must be a string or a list of token ids")


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]


class OpenAIParams(BaseModel):
    """Fields shared by completions and chat."""

    model_config = STRICT
    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = UNSUPPORTED
    null_is_unset: ClassVar[bool] = True  # `"n": null` is n = 1 (see _refuse_unsupported)
    model: ModelName | None = None  # the base model or an adapter (see openai_api)
    max_tokens: NewTokens | None = Field(
        None, description="the prompt's tokens plus these must fit the model's context and the memory pool"
    )
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: Int(ge=-1) = 0  # extension (vLLM's): 0 or -1 is off
    ignore_eos: bool = False  # extension: generate exactly max_tokens tokens
    stop: UnicodeText | Annotated[list[UnicodeText], Field(json_schema_extra={"maxItems": MAX_STOP_STRINGS})] | None = (
        None
    )
    stop_token_ids: list[TokenId] | None = None  # extension (vLLM's): stop tokens added to EOS
    n: Int(ge=1, le=MAX_SEQUENCES) = 1
    seed: Int(ge=-(2**63), lt=2**64) | None = None  # vLLM takes 64-bit integers
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False)  # extension (vLLM's)
    return_tokens_as_token_ids: bool = False  # extension (vLLM's): logprobs name tokens "token_id:ID"
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None}  # null means not given (`"n": null` is n = 1)
            for name, unused in cls.unsupported.items():
                value = data.get(name)
                if value is not None and not any(
                    value == u and isinstance(value, bool) == isinstance(u, bool) for u in unused
                ):
                    raise ValueError(f"'{name}' is not supported by this server (got {value!r})")
        return data

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, value):
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings (got {len(value)})")
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return tuple(s for s in stops if s)

    @property
    def sequences(self) -> int:
        """Sequences generated per prompt."""
        return self.n

    def seed_of(self, sequence: int) -> int | None:
        """Sequence j of a prompt samples with seed + j (mod 2**64): each is reproducible, and they differ."""
        return None if self.seed is None else (self.seed + sequence) % SEED_RANGE

    def engine_logprobs(self) -> int | None:
        """What the engine computes per token: None, or the chosen token's logprob and this many more."""
        return None


class CompletionRequest(OpenAIParams):
    schema_rules: ClassVar[dict[str, Any]] = {
        "description": f"best_of is at least n, and n when streamed; prompts x (best_of or n) is at most "
        f"{MAX_SEQUENCES}; echo takes no logprobs; each prompt's tokens plus max_tokens fit the model's context "
        "and the memory pool",
    }
    prompt: (
        str
        | TokenIds
        | Annotated[list[str], Field(json_schema_extra={"minItems": 1})]
        | Annotated[list[TokenIds], Field(json_schema_extra={"minItems": 1})]
    )
    best_of: Int(ge=1, le=MAX_SEQUENCES) | None = None  # generate this many, return the n most likely
    echo: bool = False
    logprobs: Logprobs | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value):
        """One prompt (text or token ids), or several (a list of them)."""
        if isinstance(value, list) and value and not is_token_ids(value):
            return [_single_prompt(p) for p in value]
        return _single_prompt(value)

    @model_validator(mode="after")
    def _consistent(self):
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be at least n ({self.n})")
        if self.stream and self.sequences > self.n:
            raise ValueError("'best_of' greater than 'n' cannot be streamed")
        if self.echo and self.logprobs is not None:
            raise ValueError("'echo' with 'logprobs' is not supported by this server (it needs the prompt's logprobs)")
        if len(self.prompts) * self.sequences > MAX_SEQUENCES:
            raise ValueError(
                f"{len(self.prompts)} prompts x {self.sequences} sequences each is more than {MAX_SEQUENCES} "
                "in one request"
            )
        return self

    @property
    def prompts(self) -> list[Prompt]:
        """Each prompt of the request (a list of strings or of id lists is several)."""
        p = self.prompt
        return p if isinstance(p, list) and p and isinstance(p[0], str | list) else [p]

    @property
    def sequences(self) -> int:
        return self.best_of or self.n

    def engine_logprobs(self) -> int | None:
        if self.logprobs is None and self.sequences > self.n:
            return 0  # best_of ranks sequences by their cumulative logprob
        return self.logprobs


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
    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = CHAT_UNSUPPORTED
    schema_rules: ClassVar[dict[str, Any]] = {
        "description": "top_logprobs above 0 needs logprobs true; the chat prompt's tokens plus "
        "max_completion_tokens (or max_tokens) fit the model's context and the memory pool",
    }
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: NewTokens | None = None  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: Logprobs | None = None

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("'top_logprobs' needs 'logprobs': true")
        return self

    def engine_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class GenerateParameters(BaseModel):
    """S-LoRA's sampling parameters (do_sample false: greedy)."""

    model_config = STRICT
    max_new_tokens: NewTokens = 16
    do_sample: bool = False
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: Int(ge=-1) = -1
    ignore_eos: bool = False


class GenerateRequest(BaseModel):
    schema_rules: ClassVar[dict[str, Any]] = {
        "description": "the prompt's tokens plus max_new_tokens fit the model's context and the memory pool"
    }
    model_config = ConfigDict(json_schema_extra=_schema_rules)
    inputs: str | TokenIds

    @field_validator("inputs", mode="before")
    @classmethod
    def _prompt(cls, value):
        return _single_prompt(value)

    parameters: GenerateParameters = GenerateParameters()
    lora_dir: Annotated[str, _marked(ADAPTER_NAME)] | None = (
        None  # S-LoRA names the adapter by its folder; here: its name
    )
