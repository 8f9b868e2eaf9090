"""vLLM's scheduler in this process, without a model: a FairScheduler built on a tiny model folder's
config and a KV cache of a given number of blocks, fed requests, and stepped with made-up model
outputs (one token per request whose step completes its prompt or decodes). What the scheduler
decides and charges is vLLM's code and ours, exactly as in a server; only the model is left out."""

from pathlib import Path

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from slora_vtc.vllm.scheduler import FairAsyncScheduler

BLOCK = 16
TOKEN = 7  # what the made-up model always samples


def scheduler(
    model: Path, config: dict, blocks: int = 256, max_seqs: int = 4, batched: int = 64, cls=FairAsyncScheduler
):
    model_config = ModelConfig(model=str(model), dtype="float32", seed=0, max_model_len=512)
    scheduler_config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=batched, max_model_len=512,
                                       enable_chunked_prefill=True, is_encoder_decoder=False)  # fmt: skip
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config,
                             additional_config={"slora_vtc": config})  # fmt: skip
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)]
    )
    cache_config.num_gpu_blocks = blocks
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=BLOCK, log_stats=False,
               structured_output_manager=StructuredOutputManager(vllm_config))  # fmt: skip


class Requests:
    """Engine requests with random-free, distinct prompts (no two share a prefix block)."""

    def __init__(self):
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.made = 0

    def make(self, tenant: str, prompt_len: int, max_tokens: int, prompt: list[int] | None = None) -> Request:
        self.made += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args={"tenant": tenant})
        ids = prompt or [3 + (self.made * 31 + i) % 240 for i in range(prompt_len)]
        return Request(f"r{self.made}", ids, params, None, block_hasher=self.hasher)


def schedule(sched):
    """One schedule() and the made-up output its step will have: (scheduler output, model output)."""
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = [[] if sched.requests[i].is_prefill_chunk else [TOKEN] for i in ids]
    runner_output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                      sampled_token_ids=sampled)  # fmt: skip
    return out, runner_output


def step(sched):
    """One schedule() and its made-up output at once; (scheduler output, engine outputs)."""
    out, runner_output = schedule(sched)
    return out, sched.update_from_output(out, runner_output)


def run(sched, max_steps: int = 2000, depth: int = 1) -> list:
    """Step until nothing is left (bounded); every step's (scheduler output, engine outputs). With
    `depth` 2, as vLLM's async scheduling does, the next step is scheduled before the output of the
    one before it comes in."""
    done, pending = [], []
    while sched.has_requests() or pending:
        assert len(done) < max_steps, "the scheduler did not finish its requests"
        if sched.has_requests():
            pending.append(schedule(sched))
        if len(pending) >= depth or not sched.has_requests():
            out, runner_output = pending.pop(0)
            done.append((out, sched.update_from_output(out, runner_output)))
    return done
