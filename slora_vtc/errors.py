"""User-facing errors: the CLI prints them as one line and exits with status 2."""

import math


class UserError(ValueError):
    """Bad input from the user (a spec, a file, a flag). The message names the problem."""


def finite_nonnegative(value) -> bool:
    """Whether a value read from a user's file is a number (not a boolean), finite and >= 0."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value < math.inf


def json_kind(value) -> str:
    """A value's type in JSON's words, for messages."""
    names = {
        str: "a string",
        list: "a list",
        tuple: "a list",
        dict: "an object",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)
