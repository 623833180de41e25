"""Tool calls out of a reply, whole or as it streams: one parser (`CallParser`) for both, so
that a streamed call's argument fragments join into exactly the arguments of the same reply
answered whole.

The formats (hybridrt.serve.tools lists the families that use them):
  - Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. The arguments stream
    as the model writes them (their JSON text, verbatim) once the name is known; a block in
    another key order, or with arguments given as a string, is parsed when it closes.
  - Qwen3.5 / Qwen3-Coder: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>
    </function></tool_call>`. The arguments are a JSON object built one parameter at a time
    (a value that is JSON is taken as such, anything else as a string).
  - LFM2: `<|tool_call_start|>[name(key="value"), ...]<|tool_call_end|>`, a Python list of
    calls with literal keyword arguments, each call sent once its `)` arrives. The markers are
    special tokens: hybridrt.serve.tools.with_markers decodes them (and no other special token).
    A reply that is only such a list, without markers, is taken whole at its end.

Only calls of the request's functions count. A block that names no known function stays
`content`, markup and all (as before it was a call); the markup of a call never reaches
`content`. A call cut off by max_tokens keeps the arguments it got (as OpenAI's do).

Events: push() and finish() return, in order, content text (str) and tool-call deltas in
OpenAI's stream shape (dict): a call's first delta {"index", "id", "type": "function",
"function": {"name", "arguments": ""}}, then {"index", "function": {"arguments": fragment}}.
Content's trailing whitespace is held back until more text follows, and dropped when the reply
made calls, so the streamed content equals the whole reply's.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from typing import Any

from .tool_syntax import call_end, hermes, parameter_value, pythonic

OPEN, CLOSE = "<tool_call>", "</tool_call>"
START, END = "<|tool_call_start|>", "<|tool_call_end|>"  # LFM2's markers
PAIRS = {OPEN: CLOSE, START: END}
Event = str | dict[str, Any]

_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
_FUNCTION_OPEN = re.compile(r"\s*<function=([^>\n]+)>")
_FUNCTION_CLOSE = re.compile(r"\s*</function>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_PY_CALL = re.compile(r"[\s,\[]*([A-Za-z_][A-Za-z0-9_.-]*)\(")


class CallParser:
    """One choice's reply, fed in pieces (see the module docstring)."""

    def __init__(self, names: Collection[str], bare: bool = True) -> None:
        self.known = set(names)
        self.bare = bare  # whether a reply that starts with `[` may be a list of calls
        self.text = ""  # all text fed
        self.at = 0  # where in text the parse stands
        self.said = ""  # content so far
        self.sent = 0  # characters of it handed out
        self.calls: list[dict[str, Any]] = []
        self.block: _Block | None = None
        self.holding = False  # a bare list: everything waits for finish()

    def content(self) -> str:
        return self.said.rstrip() if self.calls else self.said

    def push(self, piece: str) -> list[Event]:
        self.text += piece
        return self._advance(final=False)

    def finish(self) -> list[Event]:
        if self.holding:
            return self._bare()
        out = self._advance(final=True)
        if self.block is not None:
            out += self._close(self.block, self.text[self.block.start :], closed=False)
            self.block = None
        self.at = len(self.text)
        rest = self.content()[self.sent :]
        self.sent += len(rest)
        return out + ([rest] if rest else [])

    def _advance(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while not self.holding:
            if self.block is None:
                rest = self.text[self.at :]
                if self.bare and not self.said.strip() and not self.calls and rest.lstrip().startswith("["):
                    self.holding = True
                    break
                hits = [(i, o) for o in PAIRS if (i := rest.find(o)) >= 0]
                if not hits:
                    end = len(rest) if final else len(rest) - _partial(rest, PAIRS)
                    out += self._say(rest[:end])
                    self.at += end
                    break
                i, opener = min(hits)
                out += self._say(rest[:i])
                self.at += i + len(opener)
                self.block = _Block(opener, self.at, len(self.calls))
            block = self.block
            inner = self.text[block.start :]
            end = inner.find(block.closer)
            out += block.advance(self, inner if end < 0 else inner[:end], closed=end >= 0 or final)
            if end < 0:
                break
            out += self._close(block, inner[:end], closed=True)
            self.block = None
            self.at = block.start + end + len(block.closer)
        return out

    def _say(self, text: str) -> list[Event]:
        self.said += text
        ready = len(self.said.rstrip())
        if ready <= self.sent:
            return []
        piece = self.said[self.sent : ready]
        self.sent = ready
        return [piece]

    def _close(self, block: _Block, inner: str, closed: bool) -> list[Event]:
        """A block ends (its closer, or the reply's end): a block that started no call is
        parsed whole, and failing that is content (LFM2's markers, being special tokens, not)."""
        if len(self.calls) > block.first:
            return []
        found = hermes(inner.strip(), self.known) if block.opener == OPEN else None
        if found:
            out: list[Event] = []
            for name, args in found:
                out += self.start_call(name)
                out += self.add_arguments(json.dumps(args, ensure_ascii=False))
            return out
        shown = f"{OPEN}{inner}{CLOSE if closed else ''}"
        return self._say(shown if block.opener == OPEN else inner)

    def _bare(self) -> list[Event]:
        rest = self.text[self.at :]
        found = pythonic(rest.strip(), self.known)
        self.holding = False
        if not found:
            again = CallParser(self.known, bare=False)
            out = again.push(self.said + rest) + again.finish()  # said: whitespace, none of it sent
            self.said, self.sent, self.calls = again.said, again.sent, again.calls
            self.at = len(self.text)
            return out
        out = []
        for name, args in found:
            out += self.start_call(name) + self.add_arguments(json.dumps(args, ensure_ascii=False))
        self.said, self.at = "", len(self.text)
        return out

    def start_call(self, name: str) -> list[Event]:
        call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": ""}}
        self.calls.append(call)
        return [
            {
                "index": len(self.calls) - 1,
                "id": call["id"],
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
        ]

    def add_arguments(self, fragment: str) -> list[Event]:
        if not fragment:
            return []
        self.calls[-1]["function"]["arguments"] += fragment
        return [{"index": len(self.calls) - 1, "function": {"arguments": fragment}}]


class _Block:
    """The inside of one `<tool_call>` or LFM2 marker pair, parsed as far as it has come."""

    def __init__(self, opener: str, start: int, first: int) -> None:
        self.opener, self.closer, self.start, self.first = opener, PAIRS[opener], start, first
        self.at = 0  # where in the inner text the parse stands
        self.kind = ""  # "json", "xml" or "python" once known
        self.depth = 0  # json: open brackets of the arguments; xml: 1 inside a known function
        self.string = ""  # json: the quote of the string the arguments are in, if any
        self.params = 0  # xml: parameters of the open function so far
        self.skip = False  # a function it named is unknown, or its arguments are done: ignore the rest

    def advance(self, parser: CallParser, inner: str, closed: bool) -> list[Event]:
        """Events from the inner text so far (`closed`: no more of it will come)."""
        if not self.kind:
            head = inner.lstrip()
            if head.startswith("{"):
                self.kind = "json"
            elif head.startswith("<function="):
                self.kind = "xml"
            elif head.startswith("[") and self.opener == START:
                self.kind = "python"
            elif len(head) >= len("<function=") or closed:
                self.kind, self.skip = "none", True
            else:
                return []
        if self.skip:
            return []
        usable = len(inner) if closed else len(inner) - _partial(inner, (self.closer,))
        return getattr(self, f"_{self.kind}")(parser, inner[:usable])

    def _json(self, parser: CallParser, inner: str) -> list[Event]:
        out: list[Event] = []
        if len(parser.calls) == self.first:
            head = _HERMES_HEAD.match(inner)
            if head is None or head.group(1) not in parser.known:
                return []  # parsed whole when the block closes
            out += parser.start_call(head.group(1))
            self.at = head.end()
        end = self.at
        while end < len(inner) and not self.skip:
            ch = inner[end]
            end += 1
            if self.string:
                if ch == "\\":
                    if end == len(inner):
                        end -= 1  # an escape whose next character has not come yet
                        break
                    end += 1
                elif ch == '"':
                    self.string = ""
            elif ch == '"':
                self.string = ch
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                self.skip = self.depth == 0
        out += parser.add_arguments(inner[self.at : end])
        self.at = end
        return out

    def _xml(self, parser: CallParser, inner: str) -> list[Event]:
        out: list[Event] = []
        while True:
            if not self.depth:
                m = _FUNCTION_OPEN.match(inner, self.at)
                if m is None:
                    return out
                name = m.group(1).strip()
                if name not in parser.known:
                    self.skip = True
                    return out
                out += parser.start_call(name)
                self.at, self.depth, self.params = m.end(), 1, 0
                continue
            m = _PARAMETER.match(inner, self.at)
            if m is not None:
                key, value = json.dumps(m.group(1).strip(), ensure_ascii=False), parameter_value(m.group(2))
                out += parser.add_arguments(
                    f"{', ' if self.params else '{'}{key}: {json.dumps(value, ensure_ascii=False)}"
                )
                self.at, self.params = m.end(), self.params + 1
                continue
            m = _FUNCTION_CLOSE.match(inner, self.at)
            if m is None:
                return out
            out += parser.add_arguments("}" if self.params else "{}")
            self.at, self.depth = m.end(), 0

    def _python(self, parser: CallParser, inner: str) -> list[Event]:
        out: list[Event] = []
        while True:
            m = _PY_CALL.match(inner, self.at)
            end = None if m is None else call_end(inner, m.end())
            if m is None or end is None:
                return out
            found = pythonic(f"[{inner[m.start(1) : end]}]", parser.known)
            if not found:
                self.skip = True
                return out
            ((name, args),) = found
            out += parser.start_call(name) + parser.add_arguments(json.dumps(args, ensure_ascii=False))
            self.at = end


def _partial(text: str, markers: Collection[str]) -> int:
    """How many characters at the end of text may be the beginning of one of the markers."""
    for k in range(max(len(m) for m in markers) - 1, 0, -1):
        if any(text.endswith(m[:k]) for m in markers if len(m) > k):
            return k
    return 0
