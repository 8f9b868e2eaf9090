"""`calibrate`: fit the simulator to a cost profile and check it against measured runs."""


def cmd_calibrate(args) -> int:
    from slora_vtc.calibrate import calibration_report

    print(calibration_report(args.profile, args.measured, args.scheduler))
    return 0


def add_parsers(sub) -> None:
    cal = sub.add_parser("calibrate", help="fit the simulator to a cost profile; check it against a measured run")
    cal.add_argument("--profile", help="cost-profile JSON (default: the artifact's A10G profile, profiles/a10g_llama7b.json)")
    cal.add_argument("--measured", action="append", default=[], help="a measured result file to replay (repeatable; default: data/measured/)")
    cal.add_argument("--scheduler", action="append", default=[], help="scheduler each measured run used, in order")
    cal.set_defaults(func=cmd_calibrate)
