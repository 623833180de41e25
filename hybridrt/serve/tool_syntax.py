"""The syntax of one tool call in each format tool_parse.py reads: where a Python-style call
ends, a Hermes block's JSON, a Qwen parameter's value, LFM2's list of calls."""

from __future__ import annotations

import ast
import json
from typing import Any


def call_end(text: str, at: int) -> int | None:
    """The index just past the `)` that closes the call whose arguments begin at `at`
    (Python literals: brackets and quoted strings); None while it is still open."""
    depth, quote, i = 1, "", at
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def hermes(inner: str, known: set[str]) -> list[tuple[str, Any]] | None:
    """The call of one whole <tool_call> block's JSON."""
    try:
        call = json.loads(inner)
    except ValueError:
        return None
    if not isinstance(call, dict) or call.get("name") not in known:
        return None
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return [(call["name"], args)] if isinstance(args, dict) else None


def parameter_value(text: str) -> Any:
    """A Qwen parameter's value: JSON when it parses as JSON, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def pythonic(text: str, known: set[str]) -> list[tuple[str, Any]] | None:
    """LFM2's `[f(a=1), g(b="x")]`: calls of known functions with literal keyword arguments."""
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    out = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in known):
            return None
        if node.args or any(k.arg is None for k in node.keywords):
            return None
        try:
            out.append((node.func.id, {k.arg: ast.literal_eval(k.value) for k in node.keywords}))
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
    return out
