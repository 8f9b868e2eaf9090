"""What a source file imports, read from its syntax tree without running it."""

import ast
from pathlib import Path


def imported(path: Path, type_checking: bool = True) -> set[str]:
    """The modules `path` imports anywhere in it (lazy imports included), absolute imports only:
    `import a.b` gives `a.b`; `from a import b` gives `a` and `a.b` (b may be a module). With
    `type_checking=False`, imports under `if TYPE_CHECKING:` are left out (they are not imports)."""
    names = set()
    for node in _nodes(path, type_checking):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _nodes(path: Path, type_checking: bool) -> list[ast.AST]:
    tree = ast.parse(path.read_text())
    if type_checking:
        return list(ast.walk(tree))
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    return [node for node in ast.walk(tree) if id(node) not in skipped]
