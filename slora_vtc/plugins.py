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
            what = f"plugin entry point '{ep.name}' ({ep.value})"
            try:
                _run_import(what, ep.module, ep.load)
            except ModuleNotFoundError:
                raise UserError(f"{what}: no such module '{ep.module}'") from None
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
    if name.endswith(".py") or os.sep in name or (os.altsep and os.altsep in name):
        path = Path(name)
        if not path.is_file():
            raise UserError(f"plugin {path}: no such file")
        if path.suffix != ".py":
            raise UserError(f"plugin {path}: not a .py file (a plugin is a .py file or an importable module)")
        module_name = f"slora_vtc_plugin_{path.resolve().as_posix().encode().hex()}"
        if module_name in sys.modules:  # loaded before in this process: its registrations stand
            return
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            _run_import(f"plugin {path}", module_name, lambda: spec.loader.exec_module(module), path)
        except BaseException:
            del sys.modules[module_name]
            raise
        return
    try:
        _run_import(f"plugin '{name}'", name, lambda: importlib.import_module(name))
    except ModuleNotFoundError:
        if Path(name).is_file():
            raise UserError(f"plugin {name}: not a .py file (a plugin is a .py file or an importable module)") from None
        raise UserError(f"plugin '{name}': no such module (give a .py file or an importable module)") from None


def _run_import(what: str, module_name: str, load, path: Path | None = None) -> None:
    """Import a plugin by calling `load`; whatever goes wrong in its code is one UserError naming `what`
    (a plugin's own missing import included, so the CLI does not take it for a missing real-engine
    package). A ModuleNotFoundError for `module_name` itself (no such module) is left to the caller."""
    try:
        load()
    except UserError as e:  # from a register function: a name taken, say
        raise UserError(f"{what}: {_one_line(str(e))}") from None
    except SyntaxError as e:  # IndentationError and TabError too; a file that is not UTF-8
        raise UserError(f"{what}: {_syntax_error(e, path)}") from None
    except ModuleNotFoundError as e:
        if path is None and e.name in (module_name, module_name.split(".")[0]):
            raise
        raise _failure(what, module_name, e) from None
    except (Exception, SystemExit) as e:
        raise _failure(what, module_name, e) from None


def _syntax_error(e: SyntaxError, path: Path | None) -> str:
    if e.filename is None or e.lineno is None:
        return f"SyntaxError: {_one_line(e.msg or str(e))}"
    same_file = path is not None and Path(e.filename).resolve() == path.resolve()
    where = f"line {e.lineno}" if same_file else f"{e.filename}, line {e.lineno}"
    msg = _one_line(e.msg or "")
    if msg.startswith("(unicode error) "):  # the file is not in its encoding (UTF-8 unless it declares one)
        return f"cannot decode {where}: {msg.removeprefix('(unicode error) ')}"
    return f"syntax error at {where}: {msg}"


def _failure(what: str, module_name: str, e: BaseException) -> UserError:
    """`what: TYPE at line N while importing: MESSAGE`, N being the plugin's innermost line the exception
    came through (where it raised, or the call it raised in)."""
    line = None
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == module_name:
            line = tb.tb_lineno
        tb = tb.tb_next
    where = f" at line {line}" if line is not None else ""
    if isinstance(e, SystemExit):
        return UserError(f"{what}: sys.exit({e.code!r}){where} while importing")
    message = _one_line(str(e))
    return UserError(f"{what}: {type(e).__name__}{where} while importing" + (f": {message}" if message else ""))


def _one_line(text: str) -> str:
    return " ".join(text.split())
