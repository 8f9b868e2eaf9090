"""Token counts for trace building, offline.

`approx` (default, no files needed): a rough count, not the Llama tokenizer: a word of n letters
costs max(1, round(n / 6)) tokens (common words are one token, long ones split), and each digit,
punctuation mark or other symbol one, plus BOS for prompts. For the counts the paper used, pass
`--tokenizer PATH` (a local Hugging Face folder with the Llama tokenizer), or put `prompt_tokens` /
`output_tokens` in the records.
"""

import re
from collections.abc import Callable

from slora_vtc.hf_tokenizer import load_hf_tokenizer

Counter = Callable[[str], int]
_PIECES = re.compile(r"[^\W\d_]+|\d|[^\w\s]|_")


def approx_count(text: str) -> int:
    return sum(max(1, round(len(p) / 6)) if p[0].isalpha() else 1 for p in _PIECES.findall(text))


def hf_counter(path: str) -> Counter:
    tokenizer = load_hf_tokenizer(path)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def token_counter(name: str | None) -> tuple[Counter, int]:
    """(count function, tokens added to every prompt for BOS)."""
    if name in (None, "approx"):
        return approx_count, 1
    return hf_counter(name), 1
