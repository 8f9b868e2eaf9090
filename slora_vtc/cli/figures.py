"""`figures` (regenerate every figure, its tables and figures/numbers.json) and `docs` (refresh
the numbers the documentation quotes from the files the code writes)."""

from pathlib import Path

from slora_vtc.errors import UserError


def cmd_figures(args) -> int:
    from slora_vtc.figures import render_figures

    if args.jobs < 0:
        raise UserError(f"--jobs must not be negative (0: one per core), got {args.jobs}")
    names = None if args.only is None else [name.strip() for name in args.only.split(",")]
    if names is not None and not all(names):
        raise UserError(f"--only takes comma-separated figure names (see `slora-vtc list`), got '{args.only}'")
    for path in render_figures(names, Path(args.out), jobs=args.jobs):
        print(f"wrote {path}")
    return 0


def cmd_docs(args) -> int:
    from slora_vtc.docs import DOCS, refresh_docs

    given = [Path(f).absolute() for f in args.files]  # a file named here is where the user stands, not in the repo
    for path in given:
        if not path.is_file():
            raise UserError(f"{path}: no such markdown file")
    stale = refresh_docs(given or [Path(d) for d in DOCS], write=not args.check)
    for path in stale:
        print(f"{'stale' if args.check else 'refreshed'}: {path}")
    return 1 if args.check and stale else 0


def add_parsers(sub) -> None:
    figures = sub.add_parser("figures", help="regenerate the paper's figures into figures/ (and figures/numbers.json)")
    figures.add_argument("--only", help="comma-separated figure names (see `slora-vtc list`)")
    figures.add_argument("--out", default="figures")
    figures.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per core)")
    figures.set_defaults(func=cmd_figures)

    docs = sub.add_parser(
        "docs", help="refresh the numbers quoted in README.md, paper_repro.md, docs/ and benchmarks/README.md"
    )
    docs.add_argument("files", nargs="*", help="markdown files (default: every document of the repository)")
    mode = docs.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the files (the default)")
    mode.add_argument("--check", action="store_true", help="only report stale files; exit 1 if any")
    docs.set_defaults(func=cmd_docs)
