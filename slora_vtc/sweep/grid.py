"""A grid file: `[grid]` maps Experiment settings (its flat keys, slora_vtc.experiment.KEYS) to lists of
values, `[fixed]` (optional) sets settings shared by every cell, and `[cluster]` (optional) the
cluster's shared settings (replicas, router, routers, router_sync, ...: a [fixed] table of cluster
settings only); the cells are the product of the lists, in the file's order."""

import itertools
import types
import typing
from pathlib import Path

import tomllib

from slora_vtc.errors import UserError
from slora_vtc.experiment import KEYS, default_settings, keys_of, setting_type
from slora_vtc.sweep.cell import Cell

TABLES = ("grid", "fixed", "cluster")
CLUSTER_KEYS = keys_of("cluster")


def load_grid(path: Path) -> list[Cell]:
    """The cells of a grid file, each setting checked against the type of its Experiment setting (not
    yet against the registries: `check` in the CLI does that)."""
    raw = _read_toml(path)
    unknown_tables = [k for k in raw if k not in TABLES]
    if unknown_tables:
        raise UserError(f"{path}: unknown table [{unknown_tables[0]}] (known: [grid], [fixed], [cluster])")
    grid, fixed, cluster = (_table(path, raw, name) for name in TABLES)
    not_cluster = [k for k in cluster if k not in CLUSTER_KEYS]
    if not_cluster:
        raise UserError(
            f"{path}: cluster.{not_cluster[0]} is not a cluster setting (those are: {', '.join(CLUSTER_KEYS)}); "
            "put it in [fixed]"
        )
    both = [k for k in cluster if k in fixed]
    if both:
        raise UserError(f"{path}: '{both[0]}' is in both [fixed] and [cluster]")
    fixed = {**fixed, **cluster}
    if not grid:
        raise UserError(f"{path}: no [grid] table, or it is empty: give at least one setting and its list of values")
    axes = {name: _axis(path, name, values) for name, values in grid.items()}
    shared = {name: _value(path, f"fixed.{name}", name, value) for name, value in fixed.items()}
    both = [k for k in axes if k in shared]
    if both:
        raise UserError(f"{path}: '{both[0]}' is in both [grid] and [fixed]")
    defaults = default_settings()
    missing = [name for name in KEYS if name not in defaults and name not in {**axes, **shared}]
    if missing:
        raise UserError(f"{path}: every cell needs '{missing[0]}': add it to [grid] or [fixed]")
    return [Cell({**shared, **dict(zip(axes, combo))}, tuple(axes)) for combo in itertools.product(*axes.values())]


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: cannot read grid file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a grid file (not UTF-8 text)") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML ({e})") from None


def _table(path: Path, raw: dict, name: str) -> dict:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        raise UserError(f"{path}: '{name}' must be a table ([{name}])")
    return {_field_name(path, name, key): value for key, value in table.items()}


def _field_name(path: Path, table: str, key: str) -> str:
    """An Experiment setting; `pool-tokens` (the CLI's spelling) means pool_tokens."""
    name = key.replace("-", "_")
    if name not in KEYS:
        raise UserError(f"{path}: unknown setting '{table}.{key}' (known: {', '.join(KEYS)})")
    return name


def _axis(path: Path, name: str, values) -> list:
    if not isinstance(values, list):
        raise UserError(f"{path}: grid.{name} must be a list of values (a single value belongs in [fixed])")
    if not values:
        raise UserError(f"{path}: grid.{name} is an empty list: the grid would have no cells")
    axis = [_value(path, f"grid.{name}", name, v) for v in values]
    repeated = next((v for i, v in enumerate(axis) if v in axis[:i]), None)
    if repeated is not None:
        raise UserError(f"{path}: grid.{name} lists {repeated!r} twice")
    return axis


def _value(path: Path, where: str, name: str, value):
    kind = setting_type(name)
    try:
        return _coerce(value, kind)
    except TypeError:
        raise UserError(f"{path}: {where} = {value!r} is not {_describe(kind)}") from None


def _coerce(value, kind):
    """`value` (from TOML) as a value of type `kind`; TypeError if it is not one. TOML has no null:
    a setting left out keeps Experiment's default."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        for option in typing.get_args(kind):
            if option is not type(None):
                try:
                    return _coerce(value, option)
                except TypeError:
                    pass
        raise TypeError
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, list):
            raise TypeError
        return tuple(_coerce(v, typing.get_args(kind)[0]) for v in value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError
        return float(value)
    if kind in (bool, int, str) and type(value) is not kind:
        raise TypeError
    return value


def _describe(kind) -> str:
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return " or ".join(_describe(k) for k in typing.get_args(kind) if k is not type(None))
    if typing.get_origin(kind) is tuple:
        return f"a list of {_describe(typing.get_args(kind)[0])}"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(kind, str(kind))
