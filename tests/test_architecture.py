"""The package's layers (docs/architecture.md), checked on every import statement in hybridrt/,
those inside functions included: each top-level package imports only the packages below it,
and no private name (a leading underscore) is imported from another package; and no module or
function grows past what a reader takes in at once."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hybridrt"

# What each part of the package may import (besides itself). The base (errors, _version,
# config, kinds, ffn_kinds) sits under everything; the runtime, graphs, serve and deploy never reach the
# torch side (models, export, quantization, interop), so edge devices and serverless images
# run without it.
BASE = {"errors", "_version", "config", "kinds", "ffn_kinds"}
ALLOWED: dict[str, set[str] | None] = {
    "errors": set(),
    "_version": set(),
    "kinds": {"errors"},
    "ffn_kinds": {"errors"},
    "config": {"errors", "kinds", "ffn_kinds"},
    "graphs": BASE,
    "default_model": BASE | {"graphs", "runtime", "export"},  # exports the shipped model on first use
    "runtime": BASE | {"graphs", "default_model"},
    "serve": BASE | {"graphs", "runtime", "default_model"},
    "deploy": BASE | {"graphs", "runtime", "default_model", "serve"},
    "models": BASE | {"graphs"},
    "export": BASE | {"graphs", "runtime", "models"},
    "quantization": BASE | {"graphs", "runtime"},
    "interop": BASE | {"graphs", "runtime", "models", "export"},
    "commands": None,  # the command line and the package root compose everything
    "cli": None,
    "__init__": None,
}
TORCH_FREE = {"graphs", "runtime", "serve", "deploy", "default_model"}


def _imports() -> list[tuple[str, str, str, str, int, str]]:
    """(importing part, imported part, imported module, name, line, file) per hybridrt import."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        module = ["hybridrt", *rel.with_suffix("").parts]
        is_package = module[-1] == "__init__"
        if is_package:
            module = module[:-1]
        part = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module if is_package else module[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "hybridrt":
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}" if target == "hybridrt" else target
                    out.append((part, _part(full), target, alias.name, node.lineno, str(rel)))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "hybridrt":
                        out.append((part, _part(alias.name), alias.name, "", node.lineno, str(rel)))
    return out


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_part_is_in_the_table() -> None:
    parts = {
        p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    assert parts == set(ALLOWED), "add the new part to ALLOWED (and to docs/architecture.md)"


def test_each_part_imports_only_the_parts_below_it() -> None:
    edges = {(part, imported) for part, imported, *_ in _imports()}
    assert ("export", "models") in edges and ("serve", "runtime") in edges  # the scan sees imports, lazy ones too
    assert ("default_model", "export") in edges  # inside a function
    wrong = [
        f"{where}:{line}: {part} imports {target}"
        for part, imported, target, _, line, where in _imports()
        if ALLOWED[part] is not None and imported != part and imported not in ALLOWED[part]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_torch_free_parts_reach_nothing_that_imports_torch() -> None:
    torch_side = {"models", "export", "quantization", "interop"}
    reach = {part: set(ALLOWED[part] or ()) for part in TORCH_FREE}
    for part in TORCH_FREE:  # only default_model may reach export, and only inside a function
        if part != "default_model":
            assert not reach[part] & torch_side, part


def test_no_private_name_crosses_a_package() -> None:
    wrong = [
        f"{where}:{line}: {name} from {target}"
        for part, imported, target, name, line, where in _imports()
        if imported != part and name.startswith("_") and not name.startswith("__")
    ]
    assert not wrong, "\n".join(wrong)


# Sizes a reader takes in at once: a module that grows past this is split by concern, a function
# into the steps it takes.
MODULE_LINES, FUNCTION_LINES = 350, 60


def test_modules_and_functions_stay_readable() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text, rel = path.read_text(), path.relative_to(PACKAGE)
        if len(text.splitlines()) > MODULE_LINES:
            wrong.append(f"{rel}: {len(text.splitlines())} lines (at most {MODULE_LINES})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > FUNCTION_LINES:
                    wrong.append(f"{rel}:{node.lineno}: {node.name} is {lines} lines (at most {FUNCTION_LINES})")
    assert not wrong, "\n".join(wrong)
