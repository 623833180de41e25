"""Chat messages -> prompt text, with the tokenizer config's chat template when it has one.

The default template, for models without one (the shipped default model has none):

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n

one block per message, then the assistant header the reply follows. Every rendering of a
conversation starts with the rendering of its earlier turns, so the prefix cache finds the
states of the previous turn. Tools (hybridrt.serve.tools) go to the template's `tools`
variable, or for a template that never mentions it, into the system message as text.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import GenerationError
from .grammar import response_constraint
from .protocol import ApiError, Params, logprobs_asked, params
from .tools import Tools, parse_tools, supports_tools, with_tool_prompt

if TYPE_CHECKING:
    from ..runtime.model import Model

DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatTemplate:
    def __init__(self, source: str, special: dict[str, str]) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(source)
        self.special = special
        self.source = source

    @classmethod
    def for_model(cls, directory: Path, source: str | None = None) -> ChatTemplate:
        """The template of directory/tokenizer_config.json (or the default), or `source` (a
        template given to the server) with that config's special tokens."""
        own, special = template_source(directory)
        return cls(own if source is None else source, special)

    def render(self, messages: list[dict[str, Any]], tools: Tools | None = None) -> str:
        if not supports_tools(self.source):
            messages, tools = with_tool_prompt(messages, tools), None
        extra = {} if tools is None else {"tools": list(tools.functions)}
        try:
            return self.template.render(messages=messages, add_generation_prompt=True, **self.special, **extra)
        except ApiError:
            raise
        except Exception as e:
            raise ApiError(400, f"the chat template cannot render these messages ({e})", "messages") from None


class PlainDefaultTemplate:
    """DEFAULT_CHAT_TEMPLATE rendered in Python, for deployments without jinja2 (Lambda)."""

    source = DEFAULT_CHAT_TEMPLATE

    def render(self, messages: list[dict[str, Any]], tools: Tools | None = None) -> str:
        messages = with_tool_prompt(messages, tools)
        assert all(m["role"] in ROLES for m in messages)
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def chat_template(directory: Path) -> ChatTemplate | PlainDefaultTemplate:
    """The model's chat template: jinja2's where installed; without jinja2, the default
    template in Python, or a clear error for a model with its own template."""
    source, special = template_source(directory)
    try:
        import jinja2  # noqa: F401
    except ImportError:
        if source == DEFAULT_CHAT_TEMPLATE:
            return PlainDefaultTemplate()
        raise ApiError(
            500,
            "this model's tokenizer config has a chat template, which needs jinja2: add jinja2 to the "
            "deployment (pip install jinja2), or use /v1/completions",
            code="chat_template_unavailable",
        ) from None
    return ChatTemplate(source, special)


def read_template(path: str | Path) -> str:
    """A chat template file's source (`serve --chat-template`), checked to compile."""
    path = Path(path)
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise GenerationError(f"cannot read the chat template {path}: {e}") from None
    try:
        import jinja2
    except ImportError:
        raise GenerationError("--chat-template needs jinja2 (pip install jinja2)") from None
    try:
        jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise GenerationError(
            f"the chat template {path} is not a valid Jinja template: line {e.lineno}: {e.message}"
        ) from None
    return source


def template_source(directory: Path) -> tuple[str, dict[str, str]]:
    """(template source, special tokens) of directory/tokenizer_config.json; the default
    template where it has none. Needs no jinja2."""
    path = directory / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    special = {k: _token(config.get(k)) for k in ("bos_token", "eos_token")}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return (template if isinstance(template, str) else DEFAULT_CHAT_TEMPLATE), special


def _token(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _raise(message: str) -> None:
    raise ApiError(400, f"the chat template rejects these messages: {message}", "messages")


def check_messages(value: Any) -> list[dict[str, Any]]:
    """messages: a non-empty list of {"role", "content"} with text content (a string or text
    parts); an assistant message's tool_calls (its content may then be null) and a tool
    message's tool_call_id and name pass on to the template."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"{where} must be an object with a string role", where)
        if m["role"] not in ROLES:
            raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {m['role'][:40]!r}", where)
        calls = _tool_calls(m.get("tool_calls"), where) if m["role"] == "assistant" else None
        content = "" if calls and m.get("content") is None else _content(m.get("content"), where)
        message: dict[str, Any] = {"role": m["role"], "content": content}
        if calls:
            message["tool_calls"] = calls
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                message[key] = m[key]
        out.append(message)
    return out


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]] | None:
    """An assistant message's tool_calls, with each call's JSON arguments as an object (as
    transformers' templates expect them)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(c, dict)
        and isinstance(c.get("function"), dict)
        and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments", ""), str | dict)
        for c in value
    ):
        raise ApiError(400, f"{where}.tool_calls must be a list of function calls", f"{where}.tool_calls")
    out = []
    for c in value:
        args = c["function"].get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except ValueError:
                raise ApiError(400, f"{where}.tool_calls: arguments must be JSON", f"{where}.tool_calls") from None
        function = {"name": c["function"]["name"], "arguments": args}
        out.append({"id": c.get("id"), "type": "function", "function": function})
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts", f"{where}.content")


def chat_params(model: Model, template: ChatTemplate | PlainDefaultTemplate, body: dict[str, Any]) -> Params:
    """A /v1/chat/completions request's work on `model`: its messages rendered by `template`
    and tokenized as generate() tokenizes text (<s> first where the model asks for it)."""
    messages = check_messages(body.get("messages"))
    tools = parse_tools(body)
    constraint = response_constraint(body.get("response_format"))
    forced = None if tools is None else tools.constraint()
    if forced is not None and constraint is not None:
        raise ApiError(400, "a forced tool_choice cannot be combined with response_format", "response_format")
    try:
        rows = model.prompt_rows(template.render(messages, tools)).rows
    except GenerationError as e:
        raise ApiError(400, str(e), "messages") from None
    p = params(body, rows, model.max_length, None, model.manifest.generation)
    return replace(p, logprobs=logprobs_asked(body), constraint=forced or constraint, tools=tools)
