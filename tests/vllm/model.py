"""A tiny random Llama and a byte-level BPE tokenizer, made offline: a model folder vLLM serves.

4 layers, hidden 256 (or as asked), a vocabulary of a few hundred tokens trained on one sentence; the
weights are random (seeded), so the text is noise, which is all a scheduler test needs. Run as a script to build
one: `python tests/vllm/model.py DIR`.
"""

import sys
from pathlib import Path

CORPUS = ["hello world, the quick brown fox jumps over the lazy dog"] * 10
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def build_tiny_llama(folder: Path, hidden: int = 256, layers: int = 4) -> Path:
    """Write the model and its tokenizer into `folder` (made if missing); return it. `hidden` and
    `layers` make a slower one (the fairness tests' servers: conftest.py)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


if __name__ == "__main__":
    print(build_tiny_llama(Path(sys.argv[1])))
