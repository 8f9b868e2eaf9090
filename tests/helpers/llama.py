"""The real-model tests' helpers: tiny transformers models, real engines, logit recorders."""

import os
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from slora_vtc.backends.llama import LlamaBackend, build_backend  # noqa: E402
from slora_vtc.engine import Engine  # noqa: E402
from slora_vtc.model.adapters import AdapterTable, adapter_table  # noqa: E402
from slora_vtc.request import Request, State  # noqa: E402
from tests.helpers.engine import make_engine  # noqa: E402

TINY_HF = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=5000.0,
    initializer_range=0.2,
)  # a wide init: peaked logits, so greedy never hinges on a rounding tie


def save_hf_llama(folder: Path, seed: int = 0, **overrides):
    """A random transformers LlamaForCausalLM (GQA), saved as config.json + model.safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_HF, **overrides})).eval()
    model.save_pretrained(folder)
    return model


def real_engine(backend: LlamaBackend, pool: int, scheduler: str = "fcfs", clients=("a", "b", "c"), **config) -> Engine:
    """An engine on a virtual clock (advanced by the measured step times) with the backend's adapters wired;
    `config`: more EngineConfig fields (prefix_cache, admission)."""
    return make_engine(
        scheduler,
        backend,
        clients=clients,
        pool_tokens=pool,
        adapter_row_slots=backend.spec.lora_slots_per_row,
        adapter_sizes=backend.adapters.sizes(backend.spec),
        **config,
    )


def run_real(backend: LlamaBackend, requests: list[Request], pool: int, scheduler: str = "fcfs", **options) -> Engine:
    """real_engine(backend, pool, scheduler, **options) runs the requests to the end: each one must
    finish, and the pool must be free again once the prefix cache is flushed."""
    engine = real_engine(backend, pool, scheduler, **options)
    engine.run(requests)
    assert all(r.state is State.FINISHED for r in requests)
    engine.memory.flush()
    assert engine.memory.pool.num_used == 0 and engine.memory.adapters == {}
    return engine


def tiny_backend(model: str = "tiny", pool: int = 2000, adapters: AdapterTable = AdapterTable(), **kw) -> LlamaBackend:
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # as the CLI does for small models (backends.llama.build_backend)
    return build_backend("torch", model, pool_tokens=pool, adapters=adapters, **kw)


def dummies(n: int, rank: int) -> AdapterTable:
    """n dummy adapters of one rank, named dummy-0 .. dummy-(n-1)."""
    return adapter_table(dummy=n, dummy_rank=rank)


def record_logits(backend: LlamaBackend) -> dict[int, list[torch.Tensor]]:
    """rid -> the logits of every step that request took part in, in order."""
    seen: dict[int, list[torch.Tensor]] = defaultdict(list)

    def on_logits(reqs: list[Request], logits: torch.Tensor) -> None:
        for r, row in zip(reqs, logits):
            seen[r.rid].append(row.clone())

    backend.on_logits = on_logits
    return seen


def request(
    prompt: list[int], new: int, client: str = "a", adapter: str | None = None, arrival: float = 0.0
) -> Request:
    return Request(client, len(prompt), new, arrival, adapter=adapter, prompt_ids=list(prompt))


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0].float()


def assert_logits_match_hf(folder, model, prompts, new_tokens, pool: int = 200) -> None:
    """A ragged batch through our engine: prefill and every decode step, each request's own logits
    equal transformers'."""
    backend = tiny_backend(str(folder))
    logits = record_logits(backend)
    requests = [request(p, n) for p, n in zip(prompts, new_tokens)]
    real_engine(backend, pool=pool).run(requests)
    for r in requests:
        assert r.state is State.FINISHED and len(logits[r.rid]) == r.max_new_tokens
        expected = hf_logits(model, r.prompt_ids + r.output_ids)[r.prompt_len - 1 : -1]
        torch.testing.assert_close(torch.stack(logits[r.rid]), expected, atol=1e-4, rtol=1e-4)


def copy_folder(src: Path, dst: Path) -> Path:
    """A copy of a model folder, to break on purpose."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def edit_tensors(folder: Path, edit) -> None:
    """Rewrite the folder's model.safetensors after edit(tensors) changed the dict in place."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def save_hf_llama_and_adapter(root: Path, seed: int):
    """A tiny transformers Llama in root/base, and a PEFT adapter (rank 8, every target, random A and B,
    drawn from `seed`) in root/r8; returns (root, the base model, the adapted model). Needs peft."""
    import peft
    from transformers import LlamaForCausalLM

    from slora_vtc.model.adapters import TARGETS

    model = save_hf_llama(root / "base")
    scratch = save_hf_llama(root / "scratch")
    torch.manual_seed(seed)
    wrapped = peft.get_peft_model(
        scratch, peft.LoraConfig(r=8, lora_alpha=16, target_modules=list(TARGETS), init_lora_weights=False)
    )
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)
    wrapped.save_pretrained(root / "r8")
    adapted = peft.PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(root / "base").eval(), root / "r8").eval()
    return root, model, adapted
