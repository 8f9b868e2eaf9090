"""Plugins: Python files or modules that register schedulers, backends, suites or figures.

They come from `--plugin FILE_OR_MODULE` (before the command), from `$SLORA_VTC_PLUGINS`
(separated by the OS path separator), and from installed packages' entry points in the group
`slora_vtc.plugins`. Importing a plugin is all it takes: its module calls the register functions.
"""

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from slora_vtc.errors import UserError

PLUGINS_ENV = "SLORA_VTC_PLUGINS"
ENTRY_POINT_GROUP = "slora_vtc.plugins"


def load_plugins(given: list[str]) -> None:
    env = [p for p in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if p]
    if _may_declare_entry_points(ENTRY_POINT_GROUP):
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            ep.load()
    for name in [*env, *given]:
        _load(name)


def _may_declare_entry_points(group: str) -> bool:
    """Whether an installed distribution may declare entry points in `group`: a look for the group's
    name in the entry_points.txt files of the metadata folders on sys.path (about 1 ms), so that
    a start without such plugins does not import and run importlib.metadata (tens of ms). What it
    cannot look into (a zip archive on sys.path) counts as a maybe."""
    for entry in sys.path:
        folder = entry or "."
        if os.path.isfile(folder):
            return True
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(folder, name, "entry_points.txt"), encoding="utf-8") as f:
                        if group in f.read():
                            return True
                except (OSError, UnicodeDecodeError):
                    continue
    return False


def _load(name: str) -> None:
    if not name:
        raise UserError("--plugin needs a file or module name")
    if name.endswith(".py") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise UserError(f"plugin {path}: no such file")
        module_name = f"slora_vtc_plugin_{path.resolve().as_posix().encode().hex()}"
        if module_name in sys.modules:  # loaded before in this process: its registrations stand
            return
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        return
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name.split(".")[0] and e.name != name:
            raise
        raise UserError(f"plugin '{name}': no such module (give a .py file or an importable module)") from None
