"""Imported by an engine process while it unpickles its target, before _child_main runs: records whether SIGINT
was ignored from the child's start (tests/server/test_engine_process.py)."""

import signal

from slora_vtc.errors import UserError

IGNORED_AT_IMPORT = signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def build_service():
    raise UserError(f"SIGINT ignored at import: {IGNORED_AT_IMPORT}")
