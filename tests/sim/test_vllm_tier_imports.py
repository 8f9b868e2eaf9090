"""`make test-vllm` runs tests/vllm in vLLM's venv (requirements-vllm.txt), which has pytest but not
hypothesis: no test module there, and no module of tests/ that one of them imports (directly or
through another), may import hypothesis. Checked here, in the fast tier, from the source alone."""

from pathlib import Path

from tests.helpers.files import REPO
from tests.helpers.imports import imported

NOT_IN_VLLM_VENV = {"hypothesis"}


def source_of(module: str) -> Path | None:
    """The file of a module of tests/ (None for other modules, and for names that are not modules)."""
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if module.startswith("tests.") and path.is_file():
            return path
    return None


def test_no_module_the_vllm_tier_imports_needs_hypothesis():
    todo = sorted((REPO / "tests" / "vllm").glob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        names = imported(path)
        assert not {n.split(".")[0] for n in names} & NOT_IN_VLLM_VENV, path.relative_to(REPO)
        todo += [p for p in map(source_of, names) if p is not None]
    assert REPO / "tests" / "helpers" / "engine.py" in seen  # the closure reaches the shared helpers
