"""User-facing errors: the CLI prints them as one line and exits with status 2."""


class UserError(ValueError):
    """Bad input from the user (a spec, a file, a flag). The message names the problem."""
