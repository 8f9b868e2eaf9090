"""User-facing errors: the CLI prints them as one line and exits with status 2."""

import math


class UserError(ValueError):
    """Bad input from the user (a spec, a file, a flag). The message names the problem."""


def finite_nonnegative(value) -> bool:
    """Whether a value read from a user's file is a number (not a boolean), finite and >= 0."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value < math.inf
