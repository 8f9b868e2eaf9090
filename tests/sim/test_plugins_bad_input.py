"""A plugin that cannot be imported is one line naming the plugin and what went wrong (exit status 2):
a syntax error (its line), a file that is not UTF-8, an exception its code raises (type, line and
message; a missing import of its own included), a file that is not a .py file. From --plugin and
from $SLORA_VTC_PLUGINS alike."""

import sys

import pytest

from slora_vtc.plugins import PLUGINS_ENV
from tests.helpers.cli import assert_one_line_error, run_cli


def plugin(tmp_path, name: str, source: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(source)
    return str(path)


@pytest.mark.parametrize(
    "source, problem",
    [
        (b"def x(:\n", "syntax error at line 1: invalid syntax"),
        (b"x = 1\n\nif x\n    pass\n", "syntax error at line 3: expected ':'"),
        (
            b"def f():\nreturn 1\n",
            "syntax error at line 2: expected an indented block after function definition on line 1",
        ),
        (
            b"\xff\xfe = 1\n",
            "cannot decode line 1: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
        ),
        (
            b"import nonexistent_mod_xyz\n",
            "ModuleNotFoundError at line 1 while importing: No module named 'nonexistent_mod_xyz'",
        ),
        (b'x = 1\nraise RuntimeError("boom")\n', "RuntimeError at line 2 while importing: boom"),
        (
            b'def f():\n    raise KeyError("k")\n\n\nf()\n',
            "KeyError at line 2 while importing: 'k'",  # the plugin's innermost line: where it raised
        ),
        (b'raise ValueError("two\\nlines")\n', "ValueError at line 1 while importing: two lines"),
        (b"raise RuntimeError\n", "RuntimeError at line 1 while importing"),
        (b"import sys\nsys.exit(3)\n", "sys.exit(3) at line 2 while importing"),
        (
            b"from slora_vtc.sched.registry import SCHEDULERS, register_scheduler\n"
            b'register_scheduler("vtc", SCHEDULERS["vtc"])\n',
            "scheduler 'vtc' is already registered",
        ),
    ],
)
def test_a_plugin_file_that_fails_to_import_is_one_line(tmp_path, capsys, source, problem):
    path = plugin(tmp_path, "bad_plugin.py", source)
    code, out, err = run_cli(capsys, "--plugin", path, "list")
    assert_one_line_error(code, err)
    assert err == f"slora-vtc: error: plugin {path}: {problem}\n" and out == ""


def test_a_missing_real_engine_package_in_a_plugin_is_the_plugins_error(tmp_path, capsys):
    # not "this command needs the real-engine packages": the plugin's import failed, not the command's
    path = plugin(tmp_path, "p.py", b"raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    code, _, err = run_cli(capsys, "--plugin", path, "list")
    assert_one_line_error(code, err)
    assert (
        err
        == f"slora-vtc: error: plugin {path}: ModuleNotFoundError at line 1 while importing: No module named 'torch'\n"
    )


def test_a_syntax_error_in_a_module_the_plugin_imports_names_that_file(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    helper = plugin(tmp_path, "broken_helper_xyz.py", b"x = 1\ny = (\n")
    path = plugin(tmp_path, "p.py", b"import broken_helper_xyz\n")
    code, _, err = run_cli(capsys, "--plugin", path, "list")
    assert_one_line_error(code, err)
    assert err == f"slora-vtc: error: plugin {path}: syntax error at {helper}, line 2: '(' was never closed\n"


def test_the_environment_variables_plugins_get_the_same_line(tmp_path, capsys, monkeypatch):
    path = plugin(tmp_path, "boom.py", b'raise RuntimeError("boom")\n')
    monkeypatch.setenv(PLUGINS_ENV, path)
    code, _, err = run_cli(capsys, "list")
    assert_one_line_error(code, err)
    assert err == f"slora-vtc: error: plugin {path}: RuntimeError at line 1 while importing: boom\n"


def test_a_file_that_is_not_a_py_file_is_refused(tmp_path, capsys, monkeypatch):
    path = plugin(tmp_path, "notpy.txt", b"x = 1\n")
    code, _, err = run_cli(capsys, "--plugin", path, "list")  # a path: the file is not a .py file
    assert_one_line_error(code, err)
    assert err == f"slora-vtc: error: plugin {path}: not a .py file (a plugin is a .py file or an importable module)\n"
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "--plugin", "notpy.txt", "list")  # no separator: a module name, but a file here
    assert_one_line_error(code, err)
    assert (
        err == "slora-vtc: error: plugin notpy.txt: not a .py file (a plugin is a .py file or an importable module)\n"
    )


def test_a_module_plugin_that_fails_to_import_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin(tmp_path, "bad_module_plugin_xyz.py", b"x = 1\nimport nonexistent_mod_xyz\n")
    code, _, err = run_cli(capsys, "--plugin", "bad_module_plugin_xyz", "list")
    assert_one_line_error(code, err)
    assert err == (
        "slora-vtc: error: plugin 'bad_module_plugin_xyz': ModuleNotFoundError at line 2 while importing: "
        "No module named 'nonexistent_mod_xyz'\n"
    )
    assert "bad_module_plugin_xyz" not in sys.modules
