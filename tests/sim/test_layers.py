"""The package's layers (docs/design.md, "Architecture"): no module imports one of a layer above its
own, and no two modules import each other, directly or around a circle (lazy imports included;
imports only for type checkers are not imports)."""

from pathlib import Path

from tests.helpers.imports import imported

PACKAGE = Path(__file__).resolve().parents[2] / "slora_vtc"

# lowest first; a module's layer is that of its top-level module or subpackage
LAYERS = [
    {"request", "workload", "results", "profile", "cost", "config", "clock", "errors", "specs", "segments", "data",
     "hf_tokenizer", "progress", "steplog"},  # records, a progress bar, the step log
    {"memory", "sched", "model"},  # the pool, the schedulers, a model's math and its records
    # the engine; calibrate_steps: a step model load_testbed reads
    {"engine", "chunked", "chunked_macro", "step_logger", "macro_step", "builder", "backends", "calibrate_steps"},
    {"cluster"},  # replicas behind routers
    {"experiment", "runner", "suites", "traces", "metrics", "summary", "calibrate", "figures", "docs", "sweep",
     "plugins", "realrun"},  # experiments
    {"serving"},  # what the server and the gateway share
    {"server", "gateway", "cli", "__main__", "vllm"},  # fronts; vllm: the scheduler plugin inside vLLM
]  # fmt: skip
LAYER_OF = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def module_name(path: Path) -> str:
    parts = ["slora_vtc", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path) -> set[str]:
    """The top-level packages `path` imports (at any depth): `vllm`, `torch`, `slora_vtc`, ..."""
    return {name.split(".")[0] for name in imported(path, type_checking=False)}


def imports(path: Path) -> set[str]:
    """The slora_vtc modules `path` imports (at any depth), leaving out `if TYPE_CHECKING:` blocks."""
    return {name for name in imported(path, type_checking=False) if name.startswith("slora_vtc.")}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {m: {i for i in imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def unit(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_every_module_has_a_layer():
    assert sorted({unit(m) for m in MODULES if m != "slora_vtc"} - set(LAYER_OF)) == []


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        (m, i) for m, targets in GRAPH.items() if m != "slora_vtc" for i in targets
        if LAYER_OF[unit(i)] > LAYER_OF[unit(m)]
    ]  # fmt: skip
    assert upward == []


def test_no_import_circles():
    """Depth-first search for a back edge (package __init__ modules re-export their children; an edge
    from a child to its own package's __init__ is the child importing a sibling through it)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for i in sorted(GRAPH[m]):
            if m.startswith(i + "."):  # a child importing its own package: that runs the package first
                continue
            if state.get(i) == 1:
                return path + [m, i]
            if i not in state and (circle := visit(i, path + [m])):
                return circle
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state:
            assert visit(m, []) is None


def test_only_the_vllm_plugin_imports_vllm():
    """vLLM (a test dependency, GPL-3.0 metadata) is imported by slora_vtc/vllm/ alone, so that
    `import slora_vtc` and everything else work without it."""
    assert "vllm" in top_level_imports(MODULES["slora_vtc.vllm.scheduler"])  # the check sees it
    importers = sorted(m for m, p in MODULES.items() if unit(m) != "vllm" and "vllm" in top_level_imports(p))
    assert importers == []
