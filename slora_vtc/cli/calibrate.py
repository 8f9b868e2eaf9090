"""`calibrate`: fit the simulator to a cost profile and a measured run of a testbed, and say how
well it predicts every measured run given; or (`--vllm-steps LOG`) fit its step time to a step log
of vLLM (the plugin's `"step_log"`) or of our engine (`--step-log`)."""

from dataclasses import replace
from pathlib import Path

from slora_vtc.errors import UserError


def cmd_calibrate(args) -> int:
    if args.vllm_steps:
        return _calibrate_from_steps(args)
    from slora_vtc.backends.sim import StepTimeModel, save_testbed
    from slora_vtc.calibrate import first_run
    from slora_vtc.data import A10G_PROFILE, MEASURED, data_file
    from slora_vtc.profile import load_profile

    profile = args.profile or str(data_file(A10G_PROFILE))
    measured = args.measured or [
        str(p)
        for p in sorted(data_file(MEASURED).glob("*.jsonl"), key=lambda p: (not p.name.startswith("vtc"), p.name))
    ]
    if len(args.scheduler) > len(measured):
        raise UserError(f"{len(args.scheduler)} --scheduler values for {len(measured)} measured runs")
    schedulers = [*args.scheduler, *(_guess_scheduler(m) for m in measured[len(args.scheduler) :])]
    if args.testbed and args.out:
        raise UserError("--out writes a calibrated testbed; with --testbed nothing is calibrated")
    points = load_profile(profile)
    model = StepTimeModel.fit(points)
    print(f"profile: {profile}")
    _print_profile_fit(model, points)
    runs = [first_run(m) for m in measured]
    testbed = _testbed(args.testbed, model, measured[0], runs[0], schedulers[0])
    for path, run, scheduler in zip(measured, runs, schedulers):
        _print_comparison(testbed, path, run, scheduler)
    if args.out:
        save_testbed(testbed, args.out)
        print(f"wrote {args.out} (use it with --testbed {args.out})")
    return 0


def _print_profile_fit(model, points) -> None:
    """The fitted forward-pass model and its relative error at each profile point."""
    import pandas as pd

    print("forward pass (seconds):")
    a, b, c = model.prefill_coef
    d, e, f = model.decode_coef
    print(f"  prefill = {a:.5f} + {b:.3e} * requests + {c:.3e} * prompt_tokens")
    print(f"  decode  = {d:.5f} + {e:.3e} * max(0, requests - {model.decode_knee}) + {f:.3e} * context_tokens")
    table = pd.DataFrame(
        [
            {
                "input": p.input_len,
                "output": p.output_len,
                "batch": p.batch_size,
                "prefill err %": 100 * ep,
                "decode err %": 100 * ed,
            }
            for p, ep, ed in model.residuals(points)
        ]
    )
    print("relative residuals per profile point:")
    print(table.to_string(index=False, float_format="%.1f"))
    rms = (table[["prefill err %", "decode err %"]] ** 2).mean() ** 0.5
    print(f"rms: prefill {rms['prefill err %']:.1f}%, decode {rms['decode err %']:.1f}%")


def _testbed(given: str | None, model, path: str, run, scheduler: str):
    """The testbed given (`--testbed`), or one calibrated on the first measured run."""
    from slora_vtc.backends.sim import load_testbed
    from slora_vtc.calibrate import calibrate

    if given:
        testbed = load_testbed(given)
        print(
            f"testbed {given}: overhead {testbed.overhead_s * 1000:.2f} ms per forward pass, "
            f"cold start {testbed.cold_start_s:.2f} s (not refitted)"
        )
        return testbed
    testbed = calibrate(replace(model, overhead_s=0.0, cold_start_s=0.0), run, scheduler)
    print(
        f"testbed from {path} ({scheduler}): overhead {testbed.overhead_s * 1000:.2f} ms "
        f"per forward pass, cold start {testbed.cold_start_s:.2f} s"
    )
    return testbed


def _print_comparison(testbed, path: str, run, scheduler: str) -> None:
    """How well the testbed predicts one measured run."""
    from slora_vtc.calibrate import MIN_REQUESTS, compare

    c = compare(testbed, run, scheduler)
    worst = max(c.ttft_errors().items(), key=lambda kv: abs(kv[1]), default=("-", 0.0))
    share = max((abs(m - s) for m, s in c.share.values()), default=0.0)
    print(
        f"  {path} ({scheduler}): throughput measured {c.throughput[0]:.1f}, "
        f"simulated {c.throughput[1]:.1f} tokens/s ({c.throughput_error:+.1%}); "
        f"service shares within {100 * share:.2f} points; worst per-client mean TTFT "
        f"error {worst[1]:+.1%} ({worst[0]}, clients with {MIN_REQUESTS}+ requests)"
    )


def _calibrate_from_steps(args) -> int:
    from slora_vtc.calibrate_steps import fit_step_log, save_step_model

    options = {"--profile": args.profile, "--measured": args.measured, "--scheduler": args.scheduler,
               "--testbed": args.testbed}  # fmt: skip
    given = [flag for flag, value in options.items() if value]
    if given:
        raise UserError(f"--vllm-steps fits a testbed from the step log alone; {given[0]} does not apply")
    fit = fit_step_log(args.vllm_steps)
    m = fit.model
    print(f"step log: {args.vllm_steps} ({fit.steps} steps that computed something)")
    print("step time (seconds):")
    print(
        f"  wall = {m.base_s:.3e} + {m.prefill_token_s:.3e} * prefill_tokens + {m.prefill_pair_s:.3e} * prefill_pairs"
    )
    print(f"         + {m.decode_req_s:.3e} * decode_reqs + {m.context_token_s:.3e} * context_tokens")
    print(f"  gap  = {m.gap_s:.3e} per step (mean over the {fit.gap_steps} steps that decode)")
    print(f"  the median steps' fit (median error per step {fit.median_error:.1%}) x {fit.slowdown:.3f}, so that "
          f"the fitted wall times add up to the measured {fit.measured_wall_s:.3f} s")  # fmt: skip
    for term in fit.unmeasured:
        print(f"  no step had {term}: its cost is not measured and left 0")
    for kind, (n, measured, fitted) in fit.by_kind.items():
        error = f"({fitted / measured - 1:+.1%})" if measured else "(measured 0 s)"  # steps of a kind may take 0 s
        print(f"  {kind:<12} {n:>7} steps: measured {measured:9.3f} s, fitted {fitted:9.3f} s {error}")
    if args.out:
        save_step_model(fit, args.out, args.vllm_steps)
        print(f"wrote {args.out} (use it with --testbed {args.out})")
    return 0


def _guess_scheduler(path: str) -> str:
    stem = Path(path).stem.split("_")[0]
    return stem if stem in ("vtc", "fcfs", "lcf") else "vtc"


def add_parsers(sub) -> None:
    cal = sub.add_parser(
        "calibrate", help="fit the simulator to a cost profile and a measured run; check it against measured runs"
    )
    cal.add_argument(
        "--profile", help="cost-profile JSON (default: the artifact's A10G profile, profiles/a10g_llama7b.json)"
    )
    cal.add_argument(
        "--measured",
        action="append",
        default=[],
        help="a measured result file (repeatable); the first calibrates the testbed (default: data/measured/)",
    )
    cal.add_argument(
        "--scheduler",
        action="append",
        default=[],
        help="scheduler each measured run used, in order (default: from its name)",
    )
    cal.add_argument(
        "--testbed", help="compare the measured runs with this testbed (a name or a file) instead of calibrating one"
    )
    cal.add_argument(
        "--vllm-steps",
        metavar="LOG",
        help="fit the step time to this step log instead (vLLM's plugin `step_log`, or `--step-log` of a run; "
        "docs/vllm.md)",
    )
    cal.add_argument("--out", help="write the calibrated testbed here (a JSON file `--testbed FILE` reads)")
    cal.set_defaults(func=cmd_calibrate)
