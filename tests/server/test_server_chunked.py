"""`serve --batching chunked`: vLLM's steps behind the HTTP server (tiny model on CPU). Greedy tokens
must not depend on how the steps are batched, so the same concurrent requests against a server with
S-LoRA's loop are the expected answer; and a budget of one block makes every prompt go in chunks."""

import asyncio

import pytest
from openai import AsyncOpenAI

from slora_vtc.errors import UserError
from tests.helpers.server import running_server

PROMPTS = [list(range(3, 3 + n)) for n in (5, 40, 17, 64, 33, 9)]  # token ids; 40, 64 and 33 span chunks
OUTPUT = 12
CHUNKED = dict(batching="chunked", max_num_batched_tokens=32, max_num_seqs=4, block_size=16)


async def _complete_all(url: str) -> list[tuple[str, int]]:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    async def one(ids: list[int]) -> tuple[str, int]:
        stream = await client.completions.create(
            model="tiny", prompt=ids, max_tokens=OUTPUT, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        text, tokens = "", 0
        async for chunk in stream:
            text += "".join(choice.text for choice in chunk.choices)
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        return text, tokens

    try:
        return await asyncio.gather(*(one(ids) for ids in PROMPTS))
    finally:
        await client.close()


def _served(**batching) -> list[tuple[str, int]]:
    with running_server(pool_tokens=2000, scheduler="vtc", **batching) as srv:
        pieces = asyncio.run(_complete_all(srv.url))
        idle = srv.wait_idle()
    assert idle["slora_pool_used_tokens"] == 0
    return pieces


def test_chunked_batching_serves_the_tokens_of_the_slora_loop():
    chunked, slora = _served(**CHUNKED), _served()
    assert [tokens for _, tokens in chunked] == [OUTPUT] * len(PROMPTS)
    assert chunked == slora


def test_a_budget_smaller_than_a_block_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"--max-num-batched-tokens \(8\) is smaller than a block"):
        with running_server(batching="chunked", max_num_batched_tokens=8, block_size=16):
            pass
