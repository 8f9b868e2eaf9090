"""Real PEFT adapters of several ranks and targets in the unified pool, checked against peft itself.

The reference is peft: a tiny random transformers Llama with LoRA adapters (ranks 4, 8 and 16;
attention-only, attention + MLP, and a mixed set; different alphas; one with rsLoRA), saved with
save_pretrained. Our logits must equal peft's at prefill and at every decode step, and greedy
tokens must be equal, for each adapter alone and for one batch mixing all of them with a request
that has no adapter.
"""

import json

import pytest
import torch

from slora_vtc.errors import UserError
from slora_vtc.model.adapters import TARGETS, AdapterSpec, AdapterTable, adapter_table, read_peft_adapter
from slora_vtc.model.lora import dummy_adapter
from slora_vtc.model.spec import resolve_spec
from slora_vtc.request import State
from tests.helpers.cli import assert_one_line_error, cli
from tests.helpers.llama import TINY_HF, real_engine, record_logits, request, run_real, save_hf_llama, tiny_backend

peft = pytest.importorskip("peft")

ADAPTERS = {  # name: (r, lora_alpha, target_modules, use_rslora)
    "r4-attn": (4, 8, ["q_proj", "k_proj", "v_proj", "o_proj"], False),
    "r8-all": (8, 16, list(TARGETS), False),
    "r16-mixed": (16, 8, ["q_proj", "v_proj", "down_proj"], True),
}
PROMPTS = [[1, 17, 5, 99, 3, 42, 7], [1, 64, 3], [1, 9, 9, 120, 33, 2, 2, 80, 15, 4, 11], [1, 100, 7, 7]]
NEW = 5


def save_adapter(base, folder, r, alpha, targets, rslora, seed):
    """A PEFT adapter whose A and B are both random (PEFT would start B at zero: no effect to test)."""
    torch.manual_seed(seed)
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora, init_lora_weights=False)
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    model.unload()  # restore the base model's modules for the next adapter


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("peft")
    save_hf_llama(root / "base", max_position_embeddings=1024)
    base = save_hf_llama(
        root / "scratch", max_position_embeddings=1024
    )  # a copy to wrap (get_peft_model changes it in place)
    for i, (name, cfg) in enumerate(ADAPTERS.items()):
        save_adapter(base, root / name, *cfg, seed=10 + i)
    return root


def peft_model(root, name):
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(root / "base").eval()
    return base if name is None else peft.PeftModel.from_pretrained(base, root / name).eval()


def peft_greedy(model, prompt: list[int], new: int) -> tuple[list[int], torch.Tensor]:
    """peft's greedy tokens and the logits it computed for each of them (prefill, then every step)."""
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
        tokens = out[0].tolist()
        logits = model(input_ids=out).logits[0, len(prompt) - 1 : -1].float()
    return tokens[len(prompt) :], logits


def table(root) -> AdapterTable:
    return adapter_table([f"{name}={root / name}" for name in ADAPTERS])


def serve(root, prompts, adapters, pool=1500):
    backend = tiny_backend(str(root / "base"), pool=pool, adapters=table(root))
    logits = record_logits(backend)
    requests = [request(p, NEW, adapter=a) for p, a in zip(prompts, adapters)]
    run_real(backend, requests, pool, clients=("a",))  # every request finishes, every slot is free again
    return requests, [torch.stack(logits[r.rid]) for r in requests]


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_each_adapter_alone_matches_peft(hf, name):
    requests, logits = serve(hf, PROMPTS[:2], [name, name])
    model = peft_model(hf, name)
    for r, got in zip(requests, logits):
        tokens, want = peft_greedy(model, r.prompt_ids, NEW)
        assert r.output_ids == tokens
        torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_one_batch_mixing_every_adapter_and_none_matches_peft(hf):
    names = [*ADAPTERS, None]
    requests, logits = serve(hf, PROMPTS, names)
    assert len({r.first_token_time for r in requests}) == 1  # one prefill batch, then shared decode steps
    for r, got, name in zip(requests, logits, names):
        tokens, want = peft_greedy(peft_model(hf, name), r.prompt_ids, NEW)
        assert r.output_ids == tokens, name
        torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_adapters_really_differ(hf):
    """The comparison above could not pass with adapters ignored: each one changes the logits."""
    _, logits = serve(hf, [PROMPTS[0]] * 4, [*ADAPTERS, None])
    for got in logits[:3]:
        assert (got[0] - logits[3][0]).abs().max() > 0.05


def test_scales_and_slots_follow_each_adapters_config(hf):
    spec = resolve_spec(str(hf / "base"))
    specs = {name: read_peft_adapter(name, hf / name) for name in ADAPTERS}
    assert (
        specs["r4-attn"].scale == 8 / 4 and specs["r8-all"].scale == 16 / 8 and specs["r16-mixed"].scale == 8 / 16**0.5
    )
    # slot width = kv_heads * head_dim = 2 * 16 = 32; a row spans ceil(max(in, out) / 32) slots:
    # q, k, v, o: 64 wide -> 2 slots; gate, up, down: 96 wide -> 3 slots
    assert specs["r4-attn"].slots(spec) == 4 * (2 + 2 + 2 + 2)
    assert specs["r8-all"].slots(spec) == 8 * (2 + 2 + 2 + 2 + 3 + 3 + 3)
    assert specs["r16-mixed"].slots(spec) == 16 * (2 + 2 + 3)


def test_pool_holds_each_resident_adapter_at_its_own_size(hf):
    backend = tiny_backend(str(hf / "base"), pool=1500, adapters=table(hf))
    engine = real_engine(backend, 1500, clients=("a",))
    sizes = dict(backend.adapters.sizes(backend.spec))
    requests = [
        request(PROMPTS[i % 4], 3 + i % 5, adapter=[*ADAPTERS, None][i % 4], arrival=0.01 * i) for i in range(12)
    ]

    def on_step():
        mem = engine.memory
        kv = sum(len(r.kv_slots) for r in engine.running)
        assert mem.pool.num_used == kv + sum(sizes[a] for a in mem.adapters)
        assert {a: len(s) for a, s in mem.adapters.items()} == {a: sizes[a] for a in mem.adapters}

    engine.run(requests, on_step=on_step)
    assert engine.memory.pool.num_free == 1500 and all(r.state is State.FINISHED for r in requests)


@pytest.mark.slow
def test_generate_cli_serves_a_peft_adapter(hf):
    prompt = PROMPTS[2]
    out = cli(
        "generate",
        "--model",
        hf / "base",
        "--lora",
        f"r8={hf / 'r8-all'}",
        "--use-lora",
        "r8",
        "--greedy",
        "--ignore-eos",
        "--max-new-tokens",
        NEW,
        "--prompt-ids",
        ",".join(map(str, prompt)),
    )
    assert out.returncode == 0, out.stderr
    assert [int(t) for t in out.stdout.strip().split(",")] == peft_greedy(peft_model(hf, "r8-all"), prompt, NEW)[0]


@pytest.mark.slow
def test_run_and_profile_serve_peft_adapters(hf, tmp_path):
    from slora_vtc.cli import main
    from slora_vtc.profile import load_profile
    from slora_vtc.results import read_results

    lora = [arg for name in ("r4-attn", "r16-mixed") for arg in ("--lora", f"{name}={hf / name}")]
    out = tmp_path / "run.jsonl"
    assert (
        main(
            [
                "run",
                "--backend",
                "torch",
                "--model",
                str(hf / "base"),
                *lora,
                "--suite",
                "overload",
                "--scheduler",
                "vtc",
                "--duration",
                "3",
                "--time-scale",
                "30",
                "--pool-tokens",
                "3000",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (run,) = read_results(out)
    assert run.config["lora"] == [f"r4-attn={hf / 'r4-attn'}", f"r16-mixed={hf / 'r16-mixed'}"]
    assert len(run.responses) > 0 and all(r.status == "finished" for r in run.responses)
    profile = tmp_path / "profile.json"
    assert (
        main(
            [
                "profile",
                "--model",
                str(hf / "base"),
                *lora,
                "--inputs",
                "8,16,24",
                "--outputs",
                "2",
                "--max-batch",
                "2",
                "--pool-tokens",
                "400",
                "--out",
                str(profile),
            ]
        )
        == 0
    )
    assert [(p.input_len, p.output_len, p.batch_size) for p in load_profile(profile)] == [
        (8, 2, 2),
        (16, 2, 2),
        (24, 2, 2),
    ]


def cli_error(*args) -> str:
    out = cli(*args)
    assert_one_line_error(out.returncode, out.stderr)
    return out.stderr


@pytest.mark.slow
def test_an_unknown_adapter_is_refused_not_invented(hf):
    assert "unknown LoRA adapter 'nope'" in cli_error(
        "generate", "--model", str(hf / "base"), "--use-lora", "nope", "--prompt-ids", "1,2"
    )
    backend = tiny_backend(str(hf / "base"), pool=300, adapters=table(hf))
    req = request(PROMPTS[0], 3, adapter="nope")
    real_engine(backend, 300, clients=("a",)).run([req])
    assert req.state is State.REJECTED and "unknown LoRA adapter" in req.reason


@pytest.mark.slow
def test_bad_adapter_folders_are_refused_in_one_line(hf, tmp_path):
    base = ["generate", "--model", str(hf / "base"), "--prompt-ids", "1,2", "--use-lora", "x"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no adapter_config.json" in cli_error(*base, "--lora", f"x={empty}")

    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "adapter_config.json").write_text((hf / "r4-attn" / "adapter_config.json").read_text())
    (truncated / "adapter_model.safetensors").write_bytes(
        (hf / "r4-attn" / "adapter_model.safetensors").read_bytes()[:500]
    )
    assert "not a readable safetensors file" in cli_error(*base, "--lora", f"x={truncated}")

    unsupported = tmp_path / "unsupported"
    unsupported.mkdir()
    cfg = json.loads((hf / "r4-attn" / "adapter_config.json").read_text())
    (unsupported / "adapter_model.safetensors").write_bytes(b"")
    (unsupported / "adapter_config.json").write_text(json.dumps({**cfg, "target_modules": ["q_proj", "lm_head"]}))
    assert "target module 'lm_head' is not supported" in cli_error(*base, "--lora", f"x={unsupported}")
    (unsupported / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    assert "'use_dora'" in cli_error(*base, "--lora", f"x={unsupported}")
    (unsupported / "adapter_config.json").write_text(json.dumps({**cfg, "lora_alpha": float("nan")}))
    assert "'lora_alpha' must be a number, got NaN" in cli_error(*base, "--lora", f"x={unsupported}")
    assert "NAME=PATH" in cli_error(*base, "--lora", str(hf / "r4-attn"))


@pytest.mark.slow
def test_an_adapter_for_another_base_shape_is_refused(hf, tmp_path):
    other = save_hf_llama(tmp_path / "other", **{**TINY_HF, "hidden_size": 32, "intermediate_size": 48})
    save_adapter(other, tmp_path / "small", 4, 8, ["q_proj"], False, seed=3)
    err = cli_error(
        "generate",
        "--model",
        str(hf / "base"),
        "--lora",
        f"s={tmp_path / 'small'}",
        "--use-lora",
        "s",
        "--prompt-ids",
        "1,2",
    )
    assert "has shape" in err and "another model" in err


def test_an_adapter_larger_than_the_pool_is_refused(hf):
    with pytest.raises(UserError, match="does not fit a pool of 100 tokens"):
        tiny_backend(str(hf / "base"), pool=100, adapters=table(hf))


def test_dummy_adapters_are_seeded_by_name():
    spec = resolve_spec("tiny")
    x, y = AdapterSpec("x", 2, 2.0), AdapterSpec("y", 2, 2.0)
    assert torch.equal(dummy_adapter(spec, x).a["o_proj"][1], dummy_adapter(spec, x).a["o_proj"][1])
    assert not torch.equal(dummy_adapter(spec, x).a["o_proj"][1], dummy_adapter(spec, y).a["o_proj"][1])
