"""The model families people serve now, against transformers: a Llama 3 folder (llama3 RoPE scaling,
an EOS list, tied embeddings), a `linear` RoPE-scaled Llama, Mistral and Qwen2 (q/k/v biases);
and the one-line errors their bad variants give."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from slora_vtc.cli import main
from slora_vtc.errors import UserError
from slora_vtc.model.rope import inverse_frequencies
from slora_vtc.model.spec import resolve_spec
from slora_vtc.model.weights import load_weights
from slora_vtc.realrun import generate
from tests.helpers.cli import assert_one_line_error, cli
from tests.helpers.llama import TINY_HF, assert_logits_match_hf, copy_folder, hf_logits

TINY = {k: v for k, v in TINY_HF.items() if k != "rope_theta"}  # each model below: its family's RoPE base, or its own
# original_max_position_embeddings 64 puts the 8 frequencies of a 16-wide head in all three llama3
# bands: kept (wavelength < 16), blended (16..64) and divided by `factor` (> 64)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 5_000.0, "factor": 4.0}
NEVER_GENERATED = 127  # an EOS id listed first, which these prompts' greedy outputs never reach (checked)

PROMPTS = [[1, 17, 5, 99, 3, 42, 7], [1, 64], [1, 9, 9, 120, 33, 2, 2, 80, 15, 4, 11, 16, 23], [5]]
NEW_TOKENS = [9, 6, 12, 4]


def build(family: str):
    """A random transformers model of `family`, in eval mode."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    if family == "llama3":
        return LlamaForCausalLM(
            LlamaConfig(
                **TINY, rope_parameters=LLAMA3_ROPE, eos_token_id=[NEVER_GENERATED, 2], tie_word_embeddings=True
            )
        )
    if family == "linear":
        return LlamaForCausalLM(LlamaConfig(**TINY, rope_parameters=LINEAR_ROPE))
    if family == "mistral":
        return MistralForCausalLM(MistralConfig(**TINY, sliding_window=None))
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**TINY, use_sliding_window=False))
        with torch.no_grad():  # transformers starts the biases at zero, which would test nothing
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
        return model
    raise ValueError(family)


FAMILIES = ("llama3", "linear", "mistral", "qwen2")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    out = {}
    for seed, family in enumerate(FAMILIES):
        torch.manual_seed(seed)
        model = build(family).eval()
        folder = tmp_path_factory.mktemp(family)
        model.save_pretrained(folder)
        out[family] = folder, model
    return out


def hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    """Argmax decoding on transformers' full forward pass (its generate() would bar the EOS ids
    until `min_new_tokens`; we compare with EOS ignored)."""
    tokens = list(prompt)
    for _ in range(new):
        tokens.append(int(hf_logits(model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))  # ...: remove the key


# -- against transformers -----------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_at_every_step(models, family):
    """A ragged batch: prefill and every decode step, each request's own logits."""
    folder, model = models[family]
    assert_logits_match_hf(folder, model, PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_transformers(models, family):
    folder, model = models[family]
    expected = [hf_greedy(model, p, 10) for p in PROMPTS]
    assert generate(str(folder), PROMPTS, 10, ignore_eos=True) == expected
    assert all(NEVER_GENERATED not in tokens for tokens in expected)


@pytest.mark.parametrize("family", ["llama3", "linear", "mistral"])
def test_rotary_frequencies_are_transformers(models, family):
    folder, model = models[family]
    ours, theirs = inverse_frequencies(resolve_spec(str(folder))), model.model.rotary_emb.inv_freq
    if family == "mistral":
        assert torch.equal(ours, theirs)  # the default rope: the same numbers to the bit
        return
    torch.testing.assert_close(ours, theirs, atol=0, rtol=1e-6)
    unscaled = 1.0 / (model.config.rope_parameters["rope_theta"] ** (torch.arange(0, 16, 2).float() / 16))
    assert (ours < unscaled * 0.99).sum() >= 6  # the scaling really changed most of them


def test_specs_read_the_families_fields(models):
    llama3, qwen2 = (resolve_spec(str(models[f][0])) for f in ("llama3", "qwen2"))
    assert llama3.eos_token_ids == (NEVER_GENERATED, 2) and llama3.tie_word_embeddings and not llama3.qkv_bias
    assert (llama3.rope_scaling.kind, llama3.rope_scaling.factor, llama3.rope_scaling.original_max_position) == (
        "llama3",
        8.0,
        64,
    )
    assert qwen2.qkv_bias and qwen2.rope_scaling.kind == "default"


# -- EOS lists ------------------------------------------------------------------------------------
def test_generation_stops_at_the_second_eos_id_of_a_list(models, tmp_path):
    folder, model = models["llama3"]
    tokens = hf_greedy(model, PROMPTS[0], 8)
    stop = tokens[3]
    assert NEVER_GENERATED not in tokens and stop not in tokens[:3]
    listed = copy_folder(folder, tmp_path / "config_list")
    edit_config(listed, eos_token_id=[NEVER_GENERATED, stop])
    (listed / "generation_config.json").unlink()
    assert generate(str(listed), [PROMPTS[0]], 8) == [tokens[:4]]
    # a chat model's end-of-turn id often stands only in generation_config.json
    only_there = copy_folder(folder, tmp_path / "generation_config_list")
    edit_config(only_there, eos_token_id=NEVER_GENERATED)
    (only_there / "generation_config.json").write_text(json.dumps({"eos_token_id": [NEVER_GENERATED, stop]}))
    assert resolve_spec(str(only_there)).eos_token_ids == (NEVER_GENERATED, stop)
    assert generate(str(only_there), [PROMPTS[0]], 8) == [tokens[:4]]
    assert generate(str(only_there), [PROMPTS[0]], 8, ignore_eos=True) == [tokens]


# -- tied embeddings ------------------------------------------------------------------------------
def test_tied_embeddings_use_the_embedding_even_beside_a_stored_lm_head(models, tmp_path):
    folder, model = models["llama3"]
    assert "lm_head.weight" not in load_file(folder / "model.safetensors")
    extra = copy_folder(folder, tmp_path / "with_lm_head")
    tensors = load_file(extra / "model.safetensors")
    save_file({**tensors, "lm_head.weight": torch.randn(128, 64)}, extra / "model.safetensors")
    weights = load_weights(str(extra), resolve_spec(str(extra)), "cpu", torch.float32)
    assert weights.lm_head is weights.embed
    assert generate(str(extra), [PROMPTS[2]], 6, ignore_eos=True) == [hf_greedy(model, PROMPTS[2], 6)]


# -- configs without `architectures` --------------------------------------------------------------
@pytest.mark.parametrize("family, model_type", [("linear", "llama"), ("mistral", "mistral"), ("qwen2", "qwen2")])
def test_a_config_without_architectures_loads_by_model_type(models, tmp_path, family, model_type):
    folder = copy_folder(models[family][0], tmp_path / family)
    edit_config(folder, architectures=..., model_type=model_type)
    spec = resolve_spec(str(folder))
    assert spec.qkv_bias == (family == "qwen2")
    load_weights(str(folder), spec, "cpu", torch.float32)


# -- bad input --------------------------------------------------------------------------------------
def truncate(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


BAD_FOLDERS = {
    "truncated": ("llama3", truncate, "model.safetensors: not a readable safetensors file"),
    "string_size": (
        "llama3",
        lambda f: edit_config(f, hidden_size="64"),
        "'hidden_size' must be an integer, got \"64\"",
    ),
    "bool_layers": (
        "mistral",
        lambda f: edit_config(f, num_hidden_layers=True),
        "'num_hidden_layers' must be an integer, got true",
    ),
    "string_eps": (
        "qwen2",
        lambda f: edit_config(f, rms_norm_eps="1e-5"),
        "'rms_norm_eps' must be a number, got \"1e-5\"",
    ),
    "bad_eos": (
        "llama3",
        lambda f: edit_config(f, eos_token_id=[2, "x"]),
        "'eos_token_id' must be a token id or a list of them",
    ),
    "rope_type": (
        "linear",
        lambda f: edit_config(f, rope_parameters={"rope_type": "yarn", "factor": 4.0}),
        "'rope_parameters.rope_type' 'yarn' is not supported (supported: default, linear, llama3)",
    ),
    "rope_factor": (
        "linear",
        lambda f: edit_config(f, rope_parameters={"rope_type": "linear", "factor": "4"}),
        "'rope_parameters.factor' must be a number",
    ),
    "llama3_missing": (
        "llama3",
        lambda f: edit_config(f, rope_parameters={"rope_type": "llama3", "factor": 8.0}),
        "'rope_parameters.low_freq_factor' is missing",
    ),
    "mistral_window": (
        "mistral",
        lambda f: edit_config(f, sliding_window=16),
        "'sliding_window' is 16, below max_position_embeddings 256: sliding-window attention is not supported",
    ),
    "qwen2_window": (
        "qwen2",
        lambda f: edit_config(
            f, use_sliding_window=True, sliding_window=32, layer_types=["full_attention", "sliding_attention"]
        ),
        "'sliding_window' is 32, below max_position_embeddings 256",
    ),
    "llama_bias": ("linear", lambda f: edit_config(f, attention_bias=True), "'attention_bias' is true"),
    "mlp_bias": (
        "mistral",
        lambda f: edit_config(f, mlp_bias=True),
        "'mlp_bias' is true: MLP biases are not supported",
    ),
    "activation": ("qwen2", lambda f: edit_config(f, hidden_act="gelu"), "'hidden_act' 'gelu' is not supported"),
    "model_type": (
        "mistral",
        lambda f: edit_config(f, architectures=..., model_type="gemma"),
        "'model_type' 'gemma' is not supported",
    ),
}


def bad_folder(models, tmp_path: Path, case: str) -> Path:
    family, breaks, _ = BAD_FOLDERS[case]
    folder = copy_folder(models[family][0], tmp_path / case)
    breaks(folder)
    return folder


@pytest.mark.parametrize("case", BAD_FOLDERS)
def test_bad_folders_raise_one_clear_line(models, tmp_path, case):
    folder = bad_folder(models, tmp_path, case)
    with pytest.raises(UserError) as error:
        load_weights(str(folder), resolve_spec(str(folder)), "cpu", torch.float32)
    message = str(error.value)
    assert BAD_FOLDERS[case][2] in message and "\n" not in message, message
    assert str(folder) in message  # names the file


def test_windows_that_cannot_matter_are_accepted(models, tmp_path):
    mistral = copy_folder(models["mistral"][0], tmp_path / "mistral")
    edit_config(mistral, sliding_window=256)  # as long as the context
    qwen2 = copy_folder(models["qwen2"][0], tmp_path / "qwen2")
    edit_config(qwen2, use_sliding_window=False, sliding_window=32)  # set, but switched off
    for folder in (mistral, qwen2):
        resolve_spec(str(folder))


@pytest.mark.parametrize("case", ["truncated", "string_size", "qwen2_window"])
def test_the_cli_turns_bad_folders_into_exit_status_2(models, tmp_path, capsys, case):
    folder = bad_folder(models, tmp_path, case)
    code = main(["generate", "--model", str(folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "3"])
    assert_one_line_error(code, capsys.readouterr().err, BAD_FOLDERS[case][2])


@pytest.mark.slow
def test_a_truncated_file_is_one_line_from_a_fresh_process(models, tmp_path):
    folder = bad_folder(models, tmp_path, "truncated")
    result = cli("generate", "--model", folder, "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert_one_line_error(
        result.returncode, result.stderr, str(folder / "model.safetensors"), "not a readable safetensors file"
    )


def test_run_refuses_a_suite_longer_than_the_models_context(models, capsys):
    folder = models["mistral"][0]  # max_position_embeddings 256; the overload suite's requests are longer
    code = main(
        [
            "run",
            "--backend",
            "torch",
            "--model",
            str(folder),
            "--suite",
            "overload",
            "--scheduler",
            "vtc",
            "--duration",
            "5",
        ]
    )
    assert_one_line_error(
        code, capsys.readouterr().err, "its context is 256 tokens (max_position_embeddings)", "longest request needs"
    )
