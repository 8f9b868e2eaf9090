"""`slora-vtc generate`, `profile` and the real backends' options: output on good input, one-line errors on bad."""

import json

import pytest
import torch

from slora_vtc.profile import load_profile
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.llama import TINY_HF, copy_folder, edit_tensors, save_hf_llama


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    save_hf_llama(folder)
    return folder


def test_generate_prints_one_line_of_ids_per_prompt(capsys, hf_folder):
    code, out, _ = run_cli(
        capsys,
        "generate",
        "--model",
        hf_folder,
        "--prompt-ids",
        "1,2,3",
        "--prompt-ids",
        "1,50,60,70",
        "--max-new-tokens",
        "7",
        "--greedy",
        "--ignore-eos",
    )
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 2 and all(len(line.split(",")) == 7 for line in lines)
    assert all(0 <= int(t) < TINY_HF["vocab_size"] for line in lines for t in line.split(","))
    code, again, _ = run_cli(
        capsys,
        "generate",
        "--model",
        hf_folder,
        "--prompt-ids",
        "1,2,3",
        "--max-new-tokens",
        "7",
        "--greedy",
        "--ignore-eos",
    )
    assert again.strip() == lines[0]  # a prompt's tokens do not depend on its batch


def test_sampled_generation_is_seeded(capsys):
    args = (
        "generate",
        "--model",
        "tiny",
        "--prompt-ids",
        "1,9,9",
        "--max-new-tokens",
        "12",
        "--temperature",
        "1.5",
        "--top-k",
        "50",
        "--ignore-eos",
    )
    first = run_cli(capsys, *args, "--seed", "3")[1]
    assert run_cli(capsys, *args, "--seed", "3")[1] == first
    assert run_cli(capsys, *args, "--seed", "4")[1] != first


def test_profile_writes_a_profile_the_simulator_reads(capsys, tmp_path):
    out = tmp_path / "profile.json"
    code, text, _ = run_cli(
        capsys,
        "profile",
        "--backend",
        "torch",
        "--model",
        "tiny",
        "--pool-tokens",
        "300",
        "--inputs",
        "8,32",
        "--outputs",
        "1,6",
        "--out",
        out,
    )
    assert code == 0 and "wrote" in text
    points = {(p.input_len, p.output_len): p for p in load_profile(out)}
    assert set(points) == {(8, 1), (8, 6), (32, 1), (32, 6)}
    assert points[(8, 6)].batch_size == 300 // 14 and points[(32, 1)].batch_size == 300 // 33
    assert all(p.prefill_s > 0 and p.decode_s > 0 for p in points.values())
    assert set(json.loads(out.read_text())) == {"8", "32", "prefix_hits"}  # 256 + 32 fits the pool
    code, _, _ = run_cli(
        capsys,
        "run",
        "--backend",
        "sim",
        "--profile",
        out,
        "--suite",
        "overload",
        "--scheduler",
        "vtc",
        "--duration",
        "20",
        "--out",
        tmp_path / "sim.jsonl",
    )
    assert code == 0


def broken_folder(hf_folder, tmp_path, case):
    folder = copy_folder(hf_folder, tmp_path / case)
    config = json.loads((folder / "config.json").read_text())
    if case == "no_config":
        (folder / "config.json").unlink()
    elif case == "architecture":
        (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    elif case == "missing_tensor":
        edit_tensors(folder, lambda t: t.pop("model.norm.weight"))
    return folder


@pytest.mark.parametrize(
    "case, message",
    [
        ("no_config", "no config.json"),
        ("architecture", "unsupported architecture GPT2LMHeadModel"),
        ("missing_tensor", "tensor 'model.norm.weight' is missing"),
    ],
)
def test_bad_model_folder_is_a_one_line_error(capsys, hf_folder, tmp_path, case, message):
    folder = broken_folder(hf_folder, tmp_path, case)
    code, _, err = run_cli(capsys, "generate", "--model", folder, "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert_one_line_error(code, err, message)


TORCH_RUN = ["run", "--backend", "torch", "--suite", "overload", "--scheduler", "vtc", "--duration", "5"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--prompt-ids", ",".join(["5"] * 20), "--pool-tokens", "16"], "does not fit a pool of 16 tokens"),
        (["generate", "--prompt-ids", "1,2,999"], "token id 999 is outside the model's vocabulary"),
        (["generate", "--prompt-ids", "1,x"], "comma-separated integers"),
        (["generate", "--prompt-ids", "1,,2"], "--prompt-ids takes comma-separated integers, got '1,,2'"),
        (["generate", "--prompt-ids", "1", "--seed", "-1"], "--seed must not be negative, got -1"),
        (["generate", "--prompt-ids", "1", "--pool-tokens", "0"], "--pool-tokens must be positive, got 0"),
        (
            ["generate", "--prompt-ids", "1", "--greedy", "--temperature", "0.5", "--top-k", "3"],
            "--greedy takes the most likely token: --temperature, --top-k does not apply",
        ),
        (["profile", "--out", "p.json", "--inputs", ""], "--inputs takes comma-separated integers, got ''"),
        (["profile", "--out", "p.json", "--inputs", "8,,16"], "--inputs takes comma-separated integers, got '8,,16'"),
        (["profile", "--out", "p.json", "--outputs", "0"], "--outputs: every value must be at least 1, got '0'"),
        (["profile", "--out", "p.json", "--max-batch", "0"], "--max-batch must be positive, got 0"),
        (["profile", "--out", "."], "is a folder; --out takes a profile JSON"),
        (["profile", "--out", "p.json", "--cached-lens", "0,16"], "--cached-lens: every value must be at least 1"),
        (
            ["profile", "--out", "p.json", "--no-prefix-hits", "--cached-lens", "16"],
            "--no-prefix-hits measures no prefix hits: --cached-lens and --extend-lens do not apply",
        ),
        (["generate", "--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
        (["generate", "--prompt-ids", "1", "--max-new-tokens", "5000"], "exceed the model's context of 4096"),
        (["generate", "--model", "gpt-5", "--prompt-ids", "1"], "unknown model 'gpt-5'"),
        (["generate", "--prompt-ids", "1", "--top-p", "0"], "0 < top_p <= 1"),
        (["generate", "--prompt-ids", "1", "--dtype", "float16"], "float16 is not supported on the CPU"),
        (
            [*TORCH_RUN, "--pool-tokens", "1000", "--dummy-adapters", "1", "--adapter-rank", "200"],
            "LoRA adapter 'dummy-0' (rank 200, 4 modules) takes 1600 pool slots, "
            "which does not fit a pool of 1000 tokens",
        ),
        ([*TORCH_RUN, "--model", "nope"], "unknown model 'nope'"),
        ([*TORCH_RUN, "--time-scale", "0"], "--time-scale must be positive"),
        ([*TORCH_RUN, "--adapters", "-1"], "must not be negative"),
        (
            ["profile", "--out", "p.json", "--inputs", "8,600", "--outputs", "1", "--pool-tokens", "500"],
            "profile point (600, 1) does not fit",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_device_without_a_gpu(capsys):
    code, _, err = run_cli(capsys, "generate", "--device", "cuda", "--prompt-ids", "1")
    assert_one_line_error(code, err, "no CUDA GPU is available")
