"""`generate` (token ids for prompts) and `profile` (a cost profile of this hardware) on the real model."""

from pathlib import Path

from slora_vtc.backends.registry import get_backend
from slora_vtc.cli.experiments import add_adapter_args, add_model_args
from slora_vtc.errors import UserError
from slora_vtc.model.adapters import AdapterTable, adapter_table
from slora_vtc.results import check_writable


def adapters_of(args) -> AdapterTable:
    return adapter_table(args.lora, args.dummy_adapters, args.adapter_rank)


def cmd_generate(args) -> int:
    from slora_vtc.model.sampling_params import SamplingParams
    from slora_vtc.realrun import generate

    prompts = [_ids(text, "--prompt-ids") for text in args.prompt_ids]
    if args.seed < 0:
        raise UserError(f"--seed must not be negative, got {args.seed}")
    if args.pool_tokens is not None and args.pool_tokens <= 0:
        raise UserError(f"--pool-tokens must be positive, got {args.pool_tokens}")
    temperature, top_k, top_p = _sampling_args(args)
    sampling = SamplingParams() if args.greedy else SamplingParams(temperature, top_k, top_p)
    outputs = generate(
        args.model or get_backend(args.backend).default_model,
        prompts,
        args.max_new_tokens,
        sampling,
        args.ignore_eos,
        args.backend,
        args.device,
        args.dtype,
        args.seed,
        args.pool_tokens,
        adapters_of(args),
        args.use_lora,
    )
    for ids in outputs:
        print(",".join(map(str, ids)))
    return 0


def _sampling_args(args) -> tuple[float, int, float]:
    """--temperature, --top-k, --top-p with their defaults; refused beside --greedy, which samples nothing."""
    given = [flag for flag, value in (("--temperature", args.temperature), ("--top-k", args.top_k),
                                      ("--top-p", args.top_p)) if value is not None]  # fmt: skip
    if args.greedy and given:
        raise UserError(f"--greedy takes the most likely token: {', '.join(given)} does not apply")
    return (
        1.0 if args.temperature is None else args.temperature,
        0 if args.top_k is None else args.top_k,
        1.0 if args.top_p is None else args.top_p,
    )


def _ids(text: str, flag: str, least: int = 0) -> list[int]:
    """`flag`'s comma-separated integers, each at least `least`."""
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated integers, got '{text}'") from None
    if any(v < least for v in values):
        raise UserError(f"{flag}: every value must be at least {least}, got '{text}'")
    return values


def cmd_profile(args) -> int:
    import pandas as pd

    from slora_vtc.profile import save_profile
    from slora_vtc.realrun import ARTIFACT_GRID, PREFIX_GRID, measure_profile

    if args.pool_tokens <= 0:
        raise UserError(f"--pool-tokens must be positive, got {args.pool_tokens}")
    if args.max_batch is not None and args.max_batch <= 0:
        raise UserError(f"--max-batch must be positive, got {args.max_batch}")
    check_writable(Path(args.out), "a profile JSON")  # before the measurement, which takes minutes
    grid = ARTIFACT_GRID
    if args.inputs is not None or args.outputs is not None:
        inputs = _ids("8,64,256,512" if args.inputs is None else args.inputs, "--inputs", least=1)
        outputs = _ids("1,64,128,256" if args.outputs is None else args.outputs, "--outputs", least=1)
        grid = tuple((i, o) for i in inputs for o in outputs)
    model = args.model or get_backend(args.backend).default_model
    prefix_grid = _prefix_grid(args, model)
    points, hits = measure_profile(
        args.backend,
        model,
        args.pool_tokens,
        grid,
        args.device,
        args.dtype,
        args.max_batch,
        progress=True,
        adapters=adapters_of(args),
        prefix_grid=prefix_grid,
    )
    save_profile(points, args.out, hits)
    rows = [
        {
            "input": p.input_len,
            "output": p.output_len,
            "batch": p.batch_size,
            "prefill_ms": 1000 * p.prefill_s,
            "decode_ms": 1000 * p.decode_s,
        }
        for p in points
    ]
    print(pd.DataFrame(rows).to_string(index=False, float_format="%.3f"))
    if hits:
        rows = [
            {"cached": h.cached_len, "extend": h.extend_len, "batch": h.batch_size, "prefill_ms": 1000 * h.prefill_s}
            for h in hits
        ]
        print("prefix hits:")
        print(pd.DataFrame(rows).to_string(index=False, float_format="%.3f"))
    elif not args.no_prefix_hits:
        print(
            f"prefix hits: none of {', '.join(f'{c}+{e}' for c, e in PREFIX_GRID)} "
            f"fits a pool of {args.pool_tokens} tokens (--cached-lens, --extend-lens)"
        )
    print(f"wrote {args.out}")
    return 0


def _prefix_grid(args, model: str) -> tuple[tuple[int, int], ...]:
    """--cached-lens x --extend-lens as given (measure_profile refuses what does not fit), or the default grid's
    pairs that fit."""
    from slora_vtc.realrun import PREFIX_GRID, fitting_prefix_grid

    given = args.cached_lens is not None or args.extend_lens is not None
    if args.no_prefix_hits:
        if given:
            raise UserError("--no-prefix-hits measures no prefix hits: --cached-lens and --extend-lens do not apply")
        return ()
    if given:
        cached = _ids(args.cached_lens, "--cached-lens", 1) if args.cached_lens is not None else None
        extend = _ids(args.extend_lens, "--extend-lens", 1) if args.extend_lens is not None else None
        cached = cached or sorted({c for c, _ in PREFIX_GRID})
        extend = extend or sorted({e for _, e in PREFIX_GRID})
        return tuple((c, e) for c in cached for e in extend)
    return fitting_prefix_grid(args.pool_tokens, model, adapters_of(args))


def add_parsers(sub) -> None:
    gen = sub.add_parser(
        "generate", help="generate token ids with the real model (one line per prompt, comma separated)"
    )
    add_model_args(gen, backend=True)
    add_adapter_args(gen)
    gen.add_argument(
        "--use-lora", metavar="NAME", help="serve the prompts with this adapter (a --lora or dummy adapter name)"
    )
    gen.add_argument(
        "--prompt-ids", action="append", required=True, help="comma-separated token ids; repeat for a batch"
    )
    gen.add_argument("--max-new-tokens", type=int, default=16)
    gen.add_argument("--greedy", action="store_true", help="argmax decoding (otherwise: sample)")
    gen.add_argument("--temperature", type=float, help="sampling temperature (default 1)")
    gen.add_argument("--top-k", type=int, help="keep the k most likely tokens (default 0: off)")
    gen.add_argument("--top-p", type=float, help="nucleus sampling (default 1: off)")
    gen.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    gen.add_argument("--seed", type=int, default=0, help="seed of dummy weights and of sampling")
    gen.add_argument("--pool-tokens", type=int, help="memory pool in tokens (default: just enough)")
    gen.set_defaults(func=cmd_generate)

    prof = sub.add_parser(
        "profile", help="measure prefill and decode time per request on this hardware; writes a cost profile"
    )
    add_model_args(prof, backend=True)
    add_adapter_args(prof)
    prof.add_argument(
        "--out", required=True, help="profile JSON (the format of the artifact's A10G profile, plus 'prefix_hits')"
    )
    prof.add_argument(
        "--pool-tokens", type=int, default=10_000, help="pool size; pool // (input + output) requests run together"
    )
    prof.add_argument("--inputs", help="comma-separated input lengths (default: the artifact's grid)")
    prof.add_argument("--outputs", help="comma-separated output lengths (default: the artifact's grid)")
    prof.add_argument("--max-batch", type=int, help="at most this many requests per point")
    prof.add_argument(
        "--cached-lens",
        help="comma-separated cached prefix lengths of the prefix-hit points (default 256,1024: those that fit)",
    )
    prof.add_argument("--extend-lens", help="comma-separated tokens computed after the cached prefix (default 32,128)")
    prof.add_argument("--no-prefix-hits", action="store_true", help="measure no prefix-hit points")
    prof.set_defaults(func=cmd_profile)
