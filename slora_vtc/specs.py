"""Spec strings of the registries (schedulers, routers): `name` or `name:ARG`."""

from collections.abc import Mapping

from slora_vtc.errors import UserError


def resolve_spec(kind: str, spec: str, registry: Mapping):
    """(entry, argument or None) for a spec; UserError naming what is wrong. An entry has `arg`
    (the argument's name, None: takes none), `optional` and `usage(name)`."""
    name, sep, arg = spec.partition(":")
    entry = registry.get(name)
    if entry is None:
        raise UserError(f"unknown {kind} '{name}' (known: {', '.join(registry)})")
    if entry.arg and not entry.optional and not arg:
        raise UserError(f"{kind} '{name}' needs an argument: {entry.usage(name)}")
    if entry.optional and sep and not arg:
        raise UserError(f"{kind} '{spec}': the argument after ':' is missing ({entry.usage(name)})")
    if not entry.arg and sep:
        raise UserError(f"{kind} '{name}' takes no argument, got '{spec}'")
    return entry, arg or None


def register_spec(kind: str, name: str, entry, registry: dict):
    """Add an entry under a new name (a plugin's); a taken name, or one a spec could not name, is an error."""
    if name in registry:
        raise UserError(f"{kind} '{name}' is already registered")
    if ":" in name or "," in name or not name:
        raise UserError(f"{kind} name '{name}' must be non-empty, without ':' or ','")
    registry[name] = entry
    return entry


def positive_arg(kind: str, spec: str, text: str, what: str, type_: type = float):
    """A spec's argument as a positive, finite number of `type_`; UserError naming the spec otherwise."""
    try:
        value = type_(text)
    except ValueError:
        raise UserError(
            f"{kind} '{spec}': {what} '{text}' is not a{'n integer' if type_ is int else ' number'}"
        ) from None
    if not 0 < value < float("inf"):
        raise UserError(f"{kind} '{spec}': {what} must be positive and finite, got {text}")
    return value
