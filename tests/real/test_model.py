"""The real Llama model against transformers, the torch ops against the references, the loader's errors."""

import json

import pytest
import torch
from safetensors.torch import load_file

from slora_vtc.errors import UserError
from slora_vtc.model.llama import Decode, Llama, Prefill
from slora_vtc.model.ops import load_ops
from slora_vtc.model.pool import KVPool
from slora_vtc.model.rope import default_frequencies
from slora_vtc.model.sampling import SamplingParams, sample
from slora_vtc.model.spec import MODEL_SPECS, get_model_spec, resolve_spec
from slora_vtc.model.weights import dummy_weights, load_weights
from slora_vtc.realrun import generate
from slora_vtc_kernels import reference
from tests.helpers.llama import TINY_HF, assert_logits_match_hf, copy_folder, edit_tensors, save_hf_llama

PROMPTS = [[1, 17, 5, 99, 3, 42, 7], [1, 64], [1, 9, 9, 120, 33, 2, 2, 80, 15, 4, 11, 16, 23], [5]]
NEW_TOKENS = [9, 6, 12, 4]  # ragged in time too: the decode batch shrinks as requests finish


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_llama")
    return folder, save_hf_llama(folder)


def hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def test_spec_read_from_config_json(hf):
    folder, model = hf
    spec = resolve_spec(str(folder))
    assert (spec.vocab_size, spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (128, 64, 2, 4, 2)
    assert spec.rope_theta == model.config.rope_parameters["rope_theta"] == 5000.0 and spec.rms_norm_eps == 1e-5
    assert spec.lora_slots_per_row == 2  # GQA: one slot holds 2 x 16 of a 64-wide adapter row


def test_logits_match_transformers_at_every_step(hf):
    """Ragged prompts in one batch; prefill and every decode step, each request's own logits."""
    folder, model = hf
    assert_logits_match_hf(folder, model, PROMPTS, NEW_TOKENS)


def test_greedy_generation_matches_transformers(hf):
    folder, model = hf
    ours = generate(str(folder), PROMPTS, 12, ignore_eos=True)
    assert ours == [hf_greedy(model, p, 12) for p in PROMPTS]


def test_generation_stops_at_eos_unless_ignored(hf):
    folder, model = hf
    first = hf_greedy(model, PROMPTS[0], 1)[0]
    eos_folder = folder.parent / "hf_eos"
    eos_folder.mkdir(exist_ok=True)
    for f in folder.iterdir():
        (eos_folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (eos_folder / "config.json").write_text(json.dumps({**config, "eos_token_id": first}))
    assert generate(str(eos_folder), [PROMPTS[0]], 5) == [[first]]
    assert len(generate(str(eos_folder), [PROMPTS[0]], 5, ignore_eos=True)[0]) == 5


@pytest.mark.parametrize("ops_name", ["torch", "reference"])
def test_both_cpu_op_sets_run_the_same_model(ops_name):
    """The model code is op-set agnostic: torch ops and the plain references give the same logits."""
    spec = get_model_spec("tiny")
    weights = dummy_weights(spec, seed=3)
    model = Llama(spec, weights, KVPool(spec, 64, "cpu", torch.float32), load_ops(ops_name))
    baseline = Llama(spec, weights, KVPool(spec, 64, "cpu", torch.float32), load_ops("reference"))
    prefill = Prefill(
        torch.tensor([1, 4, 5, 1, 7]),
        torch.tensor([0, 1, 2, 0, 1]),
        torch.tensor([10, 11, 12, 20, 21]),
        torch.tensor([0, 3, 5]),
        3,
    )
    decode = Decode(
        torch.tensor([8, 9]),
        torch.tensor([3, 2]),
        torch.tensor([13, 22]),
        torch.tensor([[10, 11, 12, 13], [20, 21, 22, 0]]),
        torch.tensor([4, 3]),
    )
    for batch in (prefill, decode):
        torch.testing.assert_close(model.forward(batch), baseline.forward(batch), atol=1e-5, rtol=1e-5)


# -- torch ops against the references -------------------------------------------------------
def rand(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def test_torch_ops_match_reference():
    ops = load_ops("torch")
    x, w = rand(7, 32), rand(32)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    q, k, pos = rand(7, 4, 16), rand(7, 2, 16), torch.tensor([0, 1, 2, 0, 5, 300, 4000])
    inv_freq = default_frequencies(16, 10_000.0) / torch.linspace(1.0, 8.0, 8)  # any frequencies: a scaled RoPE's too
    for ours, ref in zip(ops.rotary_embedding(q, k, pos, inv_freq), reference.rotary_embedding(q, k, pos, inv_freq)):
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    cu = torch.tensor([0, 3, 4, 7])
    v = rand(7, 2, 17)[..., :16]
    torch.testing.assert_close(
        ops.prefill_attention(q, k, v, cu, 0.25, 3), reference.prefill_attention(q, k, v, cu, 0.25)
    )
    cache_k, cache_v = rand(40, 2, 16), rand(41, 2, 16)[:40]
    table, lens = torch.tensor([[3, 9, 27, 1], [5, 6, 0, 0], [39, 0, 0, 0]]), torch.tensor([4, 2, 1])
    qd = rand(3, 4, 16)
    torch.testing.assert_close(
        ops.decode_attention(qd, cache_k, cache_v, table, lens, 0.25),
        reference.decode_attention(qd, cache_k, cache_v, table, lens, 0.25),
    )
    ck, cv, rk, rv = (torch.zeros(40, 2, 16) for _ in range(4))
    slots = torch.tensor([5, 1, 30, 2, 8, 9, 11])
    ops.kv_scatter(k, v, ck, cv, slots)
    reference.kv_scatter(k, v, rk, rv, slots)
    assert torch.equal(ck, rk) and torch.equal(cv, rv)


def test_torch_rotary_reuses_its_table_only_for_the_same_positions_and_frequencies():
    """The torch ops compute the rotary table once per forward (every layer passes the same positions tensor):
    other positions, or other frequencies, with the same shapes, must get their own rotation (the reference's)."""
    ops = load_ops("torch")
    q, k = rand(5, 4, 16), rand(5, 2, 16)
    inv_freq, other_freq = default_frequencies(16, 10_000.0), default_frequencies(16, 500.0)
    first, second = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([9, 7, 5, 3, 1])
    for pos, freq in ((first, inv_freq), (first, inv_freq), (second, inv_freq), (second, other_freq)):
        for ours, ref in zip(ops.rotary_embedding(q, k, pos, freq), reference.rotary_embedding(q, k, pos, freq)):
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_torch_attention_over_many_requests_and_prompts_of_one_length():
    """decode_attention in several chunks of requests (ragged and full tables); prefill of equal-length
    prompts in one call."""
    ops = load_ops("torch")
    batch, width = 40, 300  # 2 x 300 x 2 KV heads x 64 x 4 bytes a request: several chunks of DECODE_CHUNK_BYTES
    cache_k, cache_v = rand(batch * width, 2, 64), rand(batch * width + 1, 2, 64)[1:]
    table = torch.randperm(batch * width, generator=torch.Generator().manual_seed(0)).view(batch, width)
    q = rand(batch, 8, 64)
    for lens in (torch.full((batch,), width), torch.arange(batch) * 7 + 27):
        torch.testing.assert_close(
            ops.decode_attention(q, cache_k, cache_v, table, lens, 0.125),
            reference.decode_attention(q, cache_k, cache_v, table, lens, 0.125),
        )
    qp, kp, vp = rand(3 * 50, 8, 64), rand(3 * 50, 2, 64), rand(3 * 50, 2, 64)
    cu = torch.tensor([0, 50, 100, 150])
    torch.testing.assert_close(
        ops.prefill_attention(qp, kp, vp, cu, 0.125, 50), reference.prefill_attention(qp, kp, vp, cu, 0.125)
    )


# -- sampling ---------------------------------------------------------------------------------
def test_sampling():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    assert sample(logits, SamplingParams()).tolist() == [1, 0]
    assert sample(logits, SamplingParams(temperature=1.0, top_k=1)).tolist() == [1, 0]
    assert sample(logits, SamplingParams(temperature=1.0, top_p=0.01)).tolist() == [1, 0]
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample(logits, SamplingParams(temperature=1.0, top_k=2), gen) for _ in range(200)])
    assert set(draws[:, 0].tolist()) == {1, 3} and set(draws[:, 1].tolist()) <= {0, 1, 2, 3}
    nucleus = torch.stack([sample(logits[:1], SamplingParams(temperature=1.0, top_p=0.6), gen) for _ in range(200)])
    assert set(nucleus[:, 0].tolist()) == {1, 3}  # 1 and 3 carry ~0.47 each: both needed to pass 0.6
    for bad in (dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5)):
        with pytest.raises(UserError):
            SamplingParams(**bad)


# -- the loader's errors ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case, message",
    [
        ("no_config", "no config.json"),
        ("architecture", "unsupported architecture GemmaForCausalLM"),
        ("missing_tensor", "tensor 'model.layers.1.mlp.up_proj.weight' is missing"),
        ("bad_shape", "tensor 'model.layers.0.self_attn.k_proj.weight' has shape (64, 64), expected (32, 64)"),
        ("no_weights", "no *.safetensors files"),
        ("rope_scaling", "'rope_scaling.rope_type' 'yarn' is not supported"),
    ],
)
def test_bad_model_folders_raise_a_clear_error(hf, tmp_path, case, message):
    folder = copy_folder(hf[0], tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    if case == "no_config":
        (folder / "config.json").unlink()
    elif case == "architecture":
        (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GemmaForCausalLM"]}))
    elif case == "missing_tensor":
        edit_tensors(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    elif case == "bad_shape":
        edit_tensors(folder, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(64, 64)}))
    elif case == "no_weights":
        (folder / "model.safetensors").unlink()
    elif case == "rope_scaling":
        (folder / "config.json").write_text(
            json.dumps({**config, "rope_scaling": {"rope_type": "yarn", "factor": 8.0}})
        )
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        load_weights(str(folder), resolve_spec(str(folder)), "cpu", torch.float32)


def test_model_specs():
    assert set(MODEL_SPECS) == {"tiny", "llama-7b", "llama-2-7b", "llama-13b"}
    assert 6.7e9 < get_model_spec("llama-7b").num_params < 6.8e9
    assert get_model_spec("llama-7b").lora_slots_per_row == 1
    with pytest.raises(UserError, match="unknown model 'gpt-5'"):
        resolve_spec("gpt-5")


def test_tied_embeddings_need_no_lm_head_tensor(tmp_path):
    folder = tmp_path / "tied"
    model = save_hf_llama(folder, tie_word_embeddings=True)
    assert resolve_spec(str(folder)).tie_word_embeddings and "lm_head.weight" not in load_file(
        folder / "model.safetensors"
    )
    assert generate(str(folder), [PROMPTS[1]], 5, ignore_eos=True) == [hf_greedy(model, PROMPTS[1], 5)]


def test_config_keys_default_as_transformers_does(hf, tmp_path):
    folder = copy_folder(hf[0], tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    for key in ("num_key_value_heads", "head_dim", "rope_parameters"):
        config.pop(key)
    (folder / "config.json").write_text(json.dumps(config))
    spec = resolve_spec(str(folder))
    assert spec.num_kv_heads == spec.num_heads == 4 and spec.head_dim == 16 and spec.rope_theta == 10_000.0
    assert TINY_HF["num_key_value_heads"] == 2  # (so loading this folder's weights must now fail on k_proj's shape)
    with pytest.raises(UserError, match="k_proj.weight' has shape"):
        load_weights(str(folder), spec, "cpu", torch.float32)
