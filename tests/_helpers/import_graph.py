"""An import graph of a package read from its source (ast, nothing imported), and the cycles in it.

Shared by layout tests: `find_cycles(ROOT / "mmreward")` lists every group of modules that import each
other, directly or through others. Imports inside functions count (they run on the first call, and the
registry <-> models circle this guards against was one); `if TYPE_CHECKING:` blocks do not.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names each import reaches: 'a.b' for `import a.b` and `importlib.import_module("a.b")`,
    'a.b.c' for `from a.b import c` (a submodule, or else an attribute of a.b)."""
    names: list[str] = []
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names += [f"{base}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            names.append(node.args[0].value)  # the registry once reached the models this way
    return names


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (a name that is not a module maps to its module)."""
    package_dir = Path(package_dir)
    files = {module_name(p, package_dir): p for p in package_dir.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for name in _imported_names(tree, mod, path.name == "__init__.py"):
            # `from pkg import name`: name is a submodule or an attribute of pkg
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != mod:
                targets.add(name)
        graph[mod] = targets
    return graph


def find_cycles(package_dir: Path) -> list[list[str]]:
    """Each strongly connected group of modules (size > 1), sorted; [] when the package has no import circle."""
    graph = import_graph(package_dir)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)
