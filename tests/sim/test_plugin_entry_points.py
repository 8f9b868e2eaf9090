"""Plugins from installed packages' entry points: found, and importlib.metadata skipped where none can be."""

import importlib.metadata
import sys

import pytest

from slora_vtc.errors import UserError
from slora_vtc.plugins import ENTRY_POINT_GROUP, load_plugins


def install(site, dist: str, entry_points: str) -> None:
    """A distribution's metadata folder in `site`, as pip leaves it."""
    folder = site / f"{dist}-0.1.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (folder / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])  # nothing else installed
    yield tmp_path
    sys.modules.pop("fake_slora_plugin", None)


def test_a_declared_plugin_is_imported(site):
    (site / "fake_slora_plugin.py").write_text("LOADED = True\n")
    install(site, "other", "[console_scripts]\nother = other:main\n")
    install(site, "fake-plugin", f"[{ENTRY_POINT_GROUP}]\nfake = fake_slora_plugin\n")
    load_plugins([])
    assert sys.modules["fake_slora_plugin"].LOADED


def test_without_a_declaring_package_importlib_metadata_is_not_asked(site, monkeypatch):
    install(site, "other", "[console_scripts]\nother = other:main\n")

    def refuse(**_):
        raise AssertionError("entry_points() was called")

    monkeypatch.setattr(importlib.metadata, "entry_points", refuse)
    load_plugins([])


def test_a_zip_on_the_path_is_searched_by_importlib_metadata(site, monkeypatch):
    (site / "bundle.zip").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    sys.path.append(str(site / "bundle.zip"))
    asked = []
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: asked.append(kw) or [])
    load_plugins([])
    assert asked == [{"group": ENTRY_POINT_GROUP}]


def test_a_declared_plugin_that_raises_is_one_line(site):
    (site / "fake_slora_plugin.py").write_text('x = 1\nraise RuntimeError("boom")\n')
    install(site, "fake-plugin", f"[{ENTRY_POINT_GROUP}]\nfake = fake_slora_plugin\n")
    with pytest.raises(UserError) as e:
        load_plugins([])
    assert str(e.value) == "plugin entry point 'fake' (fake_slora_plugin): RuntimeError at line 2 while importing: boom"


def test_a_declared_plugin_that_is_not_installed_is_one_line(site):
    install(site, "fake-plugin", f"[{ENTRY_POINT_GROUP}]\nfake = fake_slora_plugin\n")
    with pytest.raises(UserError) as e:
        load_plugins([])
    assert str(e.value) == "plugin entry point 'fake' (fake_slora_plugin): no such module 'fake_slora_plugin'"
