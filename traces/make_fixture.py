"""Write traces/arena_fixture.jsonl: a small, made-up sample in Chatbot Arena's public layout.

Deterministic (seeded). It mixes the one-model layout ({model, conversation, tstamp}) and the
pairwise arena layout ({model_a, model_b, conversation_a, conversation_b, tstamp}), with
multi-turn chats and over-long replies that the pipeline must drop. Text is random words.

    python traces/make_fixture.py            # rewrites traces/arena_fixture.jsonl
"""

import json
from pathlib import Path

import numpy as np

MODELS = ("vicuna-13b", "koala-13b", "alpaca-13b", "chatglm-6b", "oasst-pythia-12b")
WORDS = ("the", "model", "answer", "question", "fair", "token", "serve", "batch", "client", "time", "cache", "llama")
START = 1_682_000_000.0  # a unix time in April 2023, when the arena ran these models
OUT = Path(__file__).resolve().parent / "arena_fixture.jsonl"


def text(rng: np.random.RandomState, words: int) -> str:
    return " ".join(rng.choice(WORDS, size=words)) + "."


def turn(rng, prompt_words: int, reply_words: int, turns: int = 1) -> list[dict]:
    conversation = []
    for _ in range(turns):
        conversation += [
            {"role": "user", "content": text(rng, prompt_words)},
            {"role": "assistant", "content": text(rng, reply_words)},
        ]
    return conversation


def record(rng: np.random.RandomState, i: int, tstamp: float) -> dict:
    turns = 2 if i % 7 == 3 else 1  # every 7th record is a two-turn chat
    reply_words = 2000 if i % 11 == 5 else int(rng.randint(5, 120))  # every 11th reply is over 1024 tokens
    prompt_words = int(rng.randint(3, 60))
    if i % 2 == 0:
        return {
            "model": MODELS[i % len(MODELS)],
            "conversation": turn(rng, prompt_words, reply_words, turns),
            "tstamp": tstamp,
        }
    a, b = rng.choice(len(MODELS), size=2, replace=False)
    return {
        "model_a": MODELS[a],
        "model_b": MODELS[b],
        "conversation_a": turn(rng, prompt_words, reply_words, turns),
        "conversation_b": turn(rng, prompt_words, int(rng.randint(5, 120)), turns),
        "tstamp": tstamp,
        "turn": turns,
    }


def main() -> None:
    rng = np.random.RandomState(7)
    times = START + np.cumsum(rng.exponential(30.0, size=60))
    OUT.write_text("".join(json.dumps(record(rng, i, float(t))) + "\n" for i, t in enumerate(times)))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
