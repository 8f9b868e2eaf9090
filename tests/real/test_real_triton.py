"""The model on the Triton kernels against the torch ops: same logits and tokens, LoRA included.

The `--backend triton` path end to end: in the Triton interpreter on a CPU (TRITON_INTERPRET=1, as
conftest sets it), compiled on a GPU (TRITON_INTERPRET=0, as scripts/gpu_check.sh runs it).
"""

import os

import pytest
import torch

from slora_vtc.backends.llama import LlamaBackend
from slora_vtc.errors import UserError
from slora_vtc.model.adapters import TARGETS, AdapterSpec, AdapterTable
from slora_vtc.model.llama import Llama
from slora_vtc.model.ops import load_ops
from slora_vtc.model.pool import KVPool
from tests.helpers.llama import record_logits, request, run_real, tiny_backend

PROMPTS = [[1, 17, 5, 99, 3, 42, 7], [1, 64, 3], [1, 9, 9, 120, 33, 2, 2, 80, 15, 4, 11], [1, 5, 6, 7]]
ADAPTERS = ["r2", None, "r4-all", "r2"]
# one batch mixing ranks 2 and 4, attention-only and attention + MLP, different scales, and no adapter
TABLE = AdapterTable((AdapterSpec("r2", 2, 4.0), AdapterSpec("r4-all", 4, 2.0, TARGETS)))


def triton_ops():
    try:
        return load_ops("triton")
    except UserError as e:
        pytest.skip(str(e))


def device() -> str:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("compiled Triton kernels need a CUDA GPU")
    return "cuda"


def serve(backend: LlamaBackend):
    logits = record_logits(backend)
    requests = [request(p, 4, adapter=a) for p, a in zip(PROMPTS, ADAPTERS)]
    run_real(backend, requests, pool=400, clients=("a",))
    return [torch.stack(logits[r.rid]) for r in requests], [r.output_ids for r in requests]


@pytest.mark.slow
def test_triton_kernels_run_the_model_like_the_torch_ops():
    dev = device()
    ops = triton_ops()
    torch_backend = tiny_backend(pool=400, adapters=TABLE, seed=5, device=dev, dtype="float32")
    model = torch_backend.model
    triton_backend = LlamaBackend(
        Llama(model.spec, model.weights, KVPool(model.spec, 400, dev, torch.float32), ops), adapters=TABLE, seed=5
    )
    (want, want_ids), (got, got_ids) = serve(torch_backend), serve(triton_backend)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w.cpu(), atol=1e-4, rtol=1e-4)
    assert got_ids == want_ids
