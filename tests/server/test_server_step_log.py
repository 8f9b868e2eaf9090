"""`serve --step-log PATH`: the real server writes the step log `calibrate --vllm-steps` reads, one record
per forward pass, under either loop. What the records must add up to follows from the requests alone:
every prompt token prefilled once (no prefix cache, a pool that never preempts), and each request's
tokens but its first (which its prefill makes) decoded one per step."""

import asyncio
import re

import pytest
from openai import AsyncOpenAI

from slora_vtc.errors import UserError
from slora_vtc.steplog import read_step_log
from tests.helpers.server import running_server

PROMPTS = [list(range(3, 3 + n)) for n in (5, 40, 17, 33)]  # token ids
OUTPUT = 7


async def _complete_all(url: str) -> None:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    try:
        await asyncio.gather(
            *(
                client.completions.create(model="tiny", prompt=ids, max_tokens=OUTPUT, extra_body={"ignore_eos": True})
                for ids in PROMPTS
            )
        )
    finally:
        await client.close()


@pytest.mark.parametrize(
    "batching",
    [{}, dict(batching="chunked", max_num_batched_tokens=32, max_num_seqs=4, block_size=16)],
    ids=["slora", "chunked"],
)
def test_the_servers_step_log_adds_up_to_its_requests(tmp_path, batching):
    log = tmp_path / "steps.jsonl"
    with running_server(pool_tokens=2000, step_log=str(log), **batching) as srv:
        asyncio.run(_complete_all(srv.url))
        srv.wait_idle()
    steps = read_step_log(log)
    assert sum(s.prefill_tokens for s in steps) == sum(len(p) for p in PROMPTS)
    assert sum(s.decode_reqs for s in steps) == len(PROMPTS) * (OUTPUT - 1)
    assert sum(s.preempted for s in steps) == 0
    assert sum(s.arrived for s in steps) == len(PROMPTS) and steps[0].arrived >= 1  # each counted once, before its step
    assert [s.step for s in steps] == list(range(len(steps)))
    assert all(s.wall_s > 0 for s in steps)  # the wall clock: real steps take time
    assert all(b.t >= a.t + a.wall_s for a, b in zip(steps, steps[1:]))  # one after another, in order


def test_a_step_log_that_cannot_be_written_is_refused_at_start(tmp_path):
    path = tmp_path / "missing" / "steps.jsonl"
    with pytest.raises(UserError, match=f"{re.escape(str(path))}: cannot write the step log"):
        with running_server(step_log=str(path)):
            pass
