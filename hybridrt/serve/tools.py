"""Function calling: `tools` and `tool_choice` in, the prompt's tool list, tool calls out.

Tools reach the model through its chat template's `tools` variable (the list of
{"type": "function", "function": {...}} objects, as transformers' apply_chat_template passes
them). A template that never mentions `tools` (the default template among them) gets
DEFAULT_TOOL_PROMPT in its system message instead, and earlier tool calls written into the
assistant messages as text, in the same format.

Tool calls are parsed from the reply (whole, or as it streams: hybridrt.serve.tool_parse) in
the formats of the released chat templates:
  - `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes; Qwen3, Granite 4,
    and the default tool prompt);
  - `<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>`
    (Qwen3.5 / Qwen3-Coder);
  - a Python list of calls, `[name(key="value")]` (LFM2, between `<|tool_call_start|>` and
    `<|tool_call_end|>`: special tokens, decoded for the parser only).
Only calls of the request's functions count; anything else stays in `content`.

`tool_choice` "required" and a named function are enforced, not hoped for: the reply is
constrained (hybridrt.serve.grammar) to `<tool_call>` blocks whose JSON names an allowed
function with arguments valid against its `parameters` schema (one block for a named function
or with parallel_tool_calls false, else up to MAX_PARALLEL_CALLS). "none" leaves the tools out
of the prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .api_error import ApiError
from .grammar import JSON_OPTIONS, Constraint
from .tool_parse import CLOSE, END, OPEN, START, CallParser

MAX_PARALLEL_CALLS = 4
FUNCTION_FIELDS = {"name", "description", "parameters", "strict"}
DEFAULT_TOOL_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
    "</tool_call>"
)


@dataclass(frozen=True)
class Tools:
    """A request's tools (OpenAI's objects, checked) and its tool_choice: "auto", "required"
    or a function's name."""

    functions: tuple[dict[str, Any], ...]
    choice: str
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [f["function"]["name"] for f in self.functions]

    def constraint(self) -> Constraint | None:
        """The grammar of a forced call ("required" or a named function); None for "auto"."""
        if self.choice == "auto":
            return None
        allowed = [f["function"] for f in self.functions if self.choice in ("required", f["function"]["name"])]
        bodies = [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in allowed
        ]
        body = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
        more = f' ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if self.choice == "required" and self.parallel else ""
        source = (
            f"start: call{more}\n"
            f'call: "{OPEN}\\n" body "\\n{CLOSE}"\n'
            f"body: %json {json.dumps(body | {'x-guidance': JSON_OPTIONS})}\n"
        )
        return Constraint.lark(source, "tool_choice")


def parse_tools(body: dict[str, Any]) -> Tools | None:
    """The request's tools and tool_choice; None when no tool may be called."""
    value, choice = body.get("tools"), body.get("tool_choice")
    functions = _functions(value)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls must be true or false", "parallel_tool_calls")
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        closed = set(choice) == {"type", "function"} and isinstance(function, dict) and set(function) == {"name"}
        if choice.get("type") != "function" or not isinstance(name, str) or not closed:
            raise ApiError(400, 'tool_choice must be {"type": "function", "function": {"name": ...}}', "tool_choice")
        if name not in [f["function"]["name"] for f in functions]:
            raise ApiError(400, f"tool_choice names {name[:64]!r}, which is not among tools", "tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise ApiError(400, 'tool_choice must be "none", "auto", "required" or a function', "tool_choice")
    elif choice == "required" and not functions:
        raise ApiError(400, 'tool_choice "required" needs tools', "tool_choice")
    if choice == "none" or not functions:
        return None
    return Tools(tuple(functions), choice, parallel is not False)


def _functions(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ApiError(400, "tools must be a list of function tools", "tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ApiError(400, f'{where} must be {{"type": "function", "function": {{...}}}}', where)
        unknown = sorted(set(tool) - {"type", "function"}) + sorted(set(function) - FUNCTION_FIELDS)
        if unknown:
            raise ApiError(400, f"{where} has unknown fields: {', '.join(unknown)[:100]}", where)
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise ApiError(400, f"{where}.function.name must be 1-64 letters, digits, _ . or -", where)
        if not isinstance(function.get("description", ""), str):
            raise ApiError(400, f"{where}.function.description must be a string", where)
        if not isinstance(function.get("parameters", {}), dict):
            raise ApiError(400, f"{where}.function.parameters must be a JSON schema object", where)
        if not isinstance(function.get("strict", False), bool | None):
            raise ApiError(400, f"{where}.function.strict must be true or false", where)
        if name in [f["function"]["name"] for f in out]:
            raise ApiError(400, f"{where}.function.name {name!r} is not unique", where)
        out.append({"type": "function", "function": function})
    return out


def supports_tools(template_source: str) -> bool:
    """Whether a chat template renders the `tools` variable itself."""
    return re.search(r"\btools\b", template_source) is not None


def with_tool_prompt(messages: list[dict[str, Any]], tools: Tools | None) -> list[dict[str, Any]]:
    """Messages for a template without tool support: DEFAULT_TOOL_PROMPT in the system message
    (when there are tools), earlier calls as `<tool_call>` text, tool results as text."""
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.get("content") or ""
        calls = m.get("tool_calls") or []
        if calls:
            blocks = [f"{OPEN}\n{json.dumps(_call_json(c), ensure_ascii=False)}\n{CLOSE}" for c in calls]
            content = "\n".join([content, *blocks] if content else blocks)
        out.append({"role": m["role"], "content": content})
    if tools is not None:
        prompt = DEFAULT_TOOL_PROMPT.format(tools="\n".join(json.dumps(f, ensure_ascii=False) for f in tools.functions))
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _call_json(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {"name": function.get("name"), "arguments": function.get("arguments")}


def parse_calls(text: str, tools: Tools) -> tuple[str, list[dict[str, Any]]]:
    """(a whole reply's content, its calls as OpenAI's tool_calls entries): what its stream
    sends (hybridrt.serve.tool_parse); content has no trailing whitespace when there are calls."""
    parser = CallParser(tools.names)
    parser.push(text)
    parser.finish()
    return parser.content(), parser.calls


class MarkedText:
    """A tokenizer whose decode keeps LFM2's tool-call markers (special tokens, which
    skip_special_tokens drops) and drops every other special token, for parsing tool calls."""

    def __init__(self, tokenizer: Any, markers: dict[int, str]) -> None:
        self.tokenizer, self.markers = tokenizer, markers

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if not skip_special_tokens:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))
        parts: list[str] = []
        run: list[int] = []
        for t in ids:
            if t in self.markers:
                parts += [self.tokenizer.decode(run, skip_special_tokens=True), self.markers[t]]
                run = []
            else:
                run.append(t)
        return "".join([*parts, self.tokenizer.decode(run, skip_special_tokens=True)])


def with_markers(tokenizer: Any) -> Any:
    """The tokenizer to decode a reply with tools by: MarkedText where the vocabulary has
    LFM2's markers, else the tokenizer itself."""
    if tokenizer is None:
        return None
    found = {i: m for m in (START, END) if (i := tokenizer.token_to_id(m)) is not None}
    return MarkedText(tokenizer, found) if found else tokenizer
