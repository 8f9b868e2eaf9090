"""`slora-vtc`: run | compare | replay | sweep | plot-sweep | figures | docs | list | calibrate | trace | generate |
profile | serve | bench-http | gateway.

Each command group lives in its own module with an `add_parsers(sub)`; `main` turns every
UserError into one line on stderr and exit status 2.
"""

import argparse
import os
import sys

from slora_vtc.cli import calibrate, experiments, figures, gateway, real, serving, sweep, traces
from slora_vtc.errors import UserError
from slora_vtc.plugins import PLUGINS_ENV, load_plugins

COMMAND_GROUPS = (experiments, sweep, figures, traces, calibrate, real, serving, gateway)

# what requirements-real.txt adds to the simulator's requirements
REAL_ENGINE_PACKAGES = {
    "torch",
    "triton",
    "transformers",
    "safetensors",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "openai",
    "httpx2",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slora-vtc", description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="import a plugin that registers schedulers, backends, suites or figures "
        f"(repeatable; also ${PLUGINS_ENV})",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_parsers(sub)
    return parser


def _plugin_args(argv: list[str]) -> list[str]:
    """--plugin values given before the command, read before the parser exists (plugins add choices)."""
    found, it = [], iter(argv)
    for arg in it:
        if arg == "--plugin":
            found.append(next(it, ""))
        elif arg.startswith("--plugin="):
            found.append(arg.partition("=")[2])
        elif not arg.startswith("-"):
            break  # the command: later --plugin flags are errors for argparse to report
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        load_plugins(_plugin_args(argv))
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UserError as e:
        print(f"slora-vtc: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        if e.name not in REAL_ENGINE_PACKAGES:
            raise
        print(
            f"slora-vtc: error: this command needs the real-engine packages ({e.name} is missing): "
            "pip install -r requirements-real.txt, or `make test`, which installs them into .venv",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:
        # the reader went away (`slora-vtc list | head -2`): not an error; keep Python quiet at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a file a command reads or writes: a folder in its place, no such folder, no permission
        where = f"{e.filename}: " if e.filename else ""
        print(f"slora-vtc: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("slora-vtc: interrupted", file=sys.stderr)
        return 130
