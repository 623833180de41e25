"""The package's import graph: no cycles, and the torch-free layers never reach up.

Every import statement counts, wherever it stands: at module level, inside a function, under
`if TYPE_CHECKING:`. A function-level import hides a cycle from Python but not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hybridrt

ROOT = Path(hybridrt.__file__).resolve().parent
# Torch-free layers (errors, graphs, runtime, serve) may not import the torch-side packages.
LOWER = ("hybridrt.errors", "hybridrt.graphs", "hybridrt.runtime", "hybridrt.serve")
UPPER = ("hybridrt.models", "hybridrt.export", "hybridrt.quantization")


def _module_name(path: Path) -> str:
    parts = ["hybridrt", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _targets(name: str, path: Path, known: set[str]) -> set[str]:
    """The hybridrt modules that `name` imports, by any import statement in its file."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "hybridrt")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            elif node.module and node.module.split(".")[0] == "hybridrt":
                base = node.module
            else:
                continue
            for alias in node.names:
                # `from pkg import submodule` imports the submodule; any other name, pkg itself.
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found & known


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _targets(name, path, set(modules)) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_import_graph_has_no_cycles() -> None:
    assert _cycles(_graph()) == []


def test_torch_free_layers_do_not_import_models_export_or_quantization() -> None:
    bad = [
        f"{name} imports {target}"
        for name, targets in _graph().items()
        if _within(name, LOWER)
        for target in sorted(targets)
        if _within(target, UPPER)
    ]
    assert bad == []


def test_the_checker_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    """Guards the checker itself: the cycles it must find were hidden exactly this way."""
    path = tmp_path / "mod.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..models.config import HybridConfig\n"
        "def f():\n    from .api import export\n    from .. import default_model\n"
    )
    known = {"hybridrt.models.config", "hybridrt.export.api", "hybridrt.default_model"}
    assert _targets("hybridrt.export.mod", path, known) == known
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
