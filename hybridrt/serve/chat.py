"""Chat messages -> prompt text, with the tokenizer config's chat template when it has one.

The default template, for models without one (the shipped default model has none):

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n

one block per message, then the assistant header the reply follows. Every rendering of a
conversation starts with the rendering of its earlier turns, so the prefix cache finds the
states of the previous turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .protocol import ApiError

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
    def for_model(cls, directory: Path) -> ChatTemplate:
        """The template of directory/tokenizer_config.json, or the default."""
        return cls(*template_source(directory))

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=True, **self.special)
        except ApiError:
            raise
        except Exception as e:
            raise ApiError(400, f"the chat template cannot render these messages ({e})", "messages") from None


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


def check_messages(value: Any) -> list[dict[str, str]]:
    """messages: a non-empty list of {"role", "content"} with text content (a string or text parts)."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"{where} must be an object with a string role", where)
        if m["role"] not in ROLES:
            raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {m['role'][:40]!r}", where)
        out.append({"role": m["role"], "content": _content(m.get("content"), where)})
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts", f"{where}.content")
