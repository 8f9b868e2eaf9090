"""The real Llama model over the unified pool (docs/design.md, "Backends").

spec.py      which model a name or Hugging Face folder means (torch-free)
adapters.py  which LoRA adapters a run serves (PEFT folders, dummies) and their pool layout (torch-free)
weights.py   dummy weights from a ModelSpec, or a folder's safetensors
pool.py      the pool's K/V buffers on the device (KV tokens and LoRA rows share them)
llama.py     the forward pass: prefill over ragged prompts (only past a cached prefix), decode through slot tables
lora.py      adapter weights: read from PEFT folders or seeded, written into the pool
sampling_params.py  SamplingParams: how a request samples, checked (torch-free)
sampling.py  greedy, temperature, top-k, top-p; presence, frequency and repetition penalties
sampler.py   a batch's next tokens, per request: its own seeded generator, its token counts, its raw logprobs
ops.py       the kernel set a model runs on; torch_ops.py is the CPU one
"""
