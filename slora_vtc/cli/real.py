"""`generate` (token ids for prompts) and `profile` (a cost profile of this hardware) on the real model."""

from slora_vtc.backends.registry import get_backend
from slora_vtc.cli.experiments import add_adapter_args, add_model_args
from slora_vtc.errors import UserError
from slora_vtc.model.adapters import AdapterTable, adapter_table


def adapters_of(args) -> AdapterTable:
    return adapter_table(args.lora, args.dummy_adapters, args.adapter_rank)


def cmd_generate(args) -> int:
    from slora_vtc.model.sampling import SamplingParams
    from slora_vtc.realrun import generate

    prompts = [_ids(text) for text in args.prompt_ids]
    sampling = SamplingParams() if args.greedy else SamplingParams(args.temperature, args.top_k, args.top_p)
    outputs = generate(args.model or get_backend(args.backend).default_model, prompts, args.max_new_tokens, sampling, args.ignore_eos, args.backend,
                       args.device, args.dtype, args.seed, args.pool_tokens, adapters_of(args), args.use_lora)
    for ids in outputs:
        print(",".join(map(str, ids)))
    return 0


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--prompt-ids takes comma-separated integers, got '{text}'") from None


def cmd_profile(args) -> int:
    import pandas as pd

    from slora_vtc.profile import save_profile
    from slora_vtc.realrun import ARTIFACT_GRID, measure_profile

    if args.pool_tokens <= 0:
        raise UserError(f"--pool-tokens must be positive, got {args.pool_tokens}")
    grid = ARTIFACT_GRID
    if args.inputs or args.outputs:
        grid = tuple((i, o) for i in _ids(args.inputs or "8,64,256,512") for o in _ids(args.outputs or "1,64,128,256"))
    points = measure_profile(args.backend, args.model or get_backend(args.backend).default_model, args.pool_tokens,
                             grid, args.device, args.dtype, args.max_batch, progress=True, adapters=adapters_of(args))
    save_profile(points, args.out)
    rows = [{"input": p.input_len, "output": p.output_len, "batch": p.batch_size, "prefill_ms": 1000 * p.prefill_s,
             "decode_ms": 1000 * p.decode_s} for p in points]
    print(pd.DataFrame(rows).to_string(index=False, float_format="%.3f"))
    print(f"wrote {args.out}")
    return 0


def add_parsers(sub) -> None:
    gen = sub.add_parser("generate", help="generate token ids with the real model (one line per prompt, comma separated)")
    add_model_args(gen, backend=True)
    add_adapter_args(gen)
    gen.add_argument("--use-lora", metavar="NAME", help="serve the prompts with this adapter (a --lora or dummy adapter name)")
    gen.add_argument("--prompt-ids", action="append", required=True, help="comma-separated token ids; repeat for a batch")
    gen.add_argument("--max-new-tokens", type=int, default=16)
    gen.add_argument("--greedy", action="store_true", help="argmax decoding (otherwise: sample)")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0, help="0: off")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    gen.add_argument("--seed", type=int, default=0, help="seed of dummy weights and of sampling")
    gen.add_argument("--pool-tokens", type=int, help="memory pool in tokens (default: just enough)")
    gen.set_defaults(func=cmd_generate)

    prof = sub.add_parser("profile", help="measure prefill and decode time per request on this hardware; writes a cost profile")
    add_model_args(prof, backend=True)
    add_adapter_args(prof)
    prof.add_argument("--out", required=True, help="profile JSON (the format of the artifact's A10G profile)")
    prof.add_argument("--pool-tokens", type=int, default=10_000, help="pool size; pool // (input + output) requests run together")
    prof.add_argument("--inputs", help="comma-separated input lengths (default: the artifact's grid)")
    prof.add_argument("--outputs", help="comma-separated output lengths (default: the artifact's grid)")
    prof.add_argument("--max-batch", type=int, help="at most this many requests per point")
    prof.set_defaults(func=cmd_profile)
