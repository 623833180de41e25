"""JSON schema pieces of the OpenAPI description (openapi.py): small builders, and OpenAI's
response bodies (completion, chat completion, model list, health, error)."""

from __future__ import annotations

from typing import Any

FINISH = {"type": ["string", "null"], "enum": ["stop", "length", "tool_calls", None]}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """schema, or null (the server takes null as "left out")."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return schema | {"type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def obj(props: dict[str, Any], required: tuple[str, ...] = (), closed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


def needs(name: str, when: dict[str, Any], other: str, value: Any) -> dict[str, Any]:
    """`other` must be `value` where `name` matches `when` (JSON schema if/then)."""
    return {
        "if": {"properties": {name: when}, "required": [name]},
        "then": {"properties": {other: {"const": value}}, "required": [other]},
    }


def integer(low: int, high: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "minimum": low}
    if high is not None:
        out["maximum"] = high
    return out


def logprob_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """The logprobs of a completion choice and of a chat choice (OpenAI's shapes)."""
    num = {"type": "number"}
    token = obj({"token": {"type": "string"}, "logprob": num, "bytes": {"type": "array", "items": integer(0, 255)}})
    chat_token = token | {"required": ["token", "logprob", "bytes", "top_logprobs"]}
    chat_token["properties"] = token["properties"] | {"top_logprobs": {"type": "array", "items": token}}
    maybe_num = {"type": ["number", "null"]}
    completion_logprobs = obj(
        {
            "tokens": {"type": "array", "items": {"type": "string"}},
            "token_logprobs": {"type": "array", "items": maybe_num},
            "top_logprobs": {"type": "array", "items": {"anyOf": [{"type": "object"}, {"type": "null"}]}},
            "text_offset": {"type": "array", "items": integer(0)},
        },
        ("tokens", "token_logprobs", "top_logprobs", "text_offset"),
    )
    chat_logprobs = obj({"content": {"type": "array", "items": chat_token}}, ("content",))
    return completion_logprobs, chat_logprobs


def response_schemas() -> dict[str, Any]:
    """Response schemas: OpenAI's completion, chat completion, model list, usage, error."""
    completion_logprobs, chat_logprobs = logprob_schemas()
    base = {"id": {"type": "string"}, "created": {"type": "integer"}, "model": {"type": "string"}}
    cached = obj({"cached_tokens": integer(0)})
    counts = {k: integer(0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    usage = obj(counts | {"prompt_tokens_details": cached}, tuple(counts))
    call = obj(
        {
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": obj({"name": {"type": "string"}, "arguments": {"type": "string"}}, ("name", "arguments")),
        },
        ("id", "type", "function"),
    )
    message = obj(
        {
            "role": {"const": "assistant"},
            "content": {"type": ["string", "null"], "description": "null when the reply is tool calls only"},
            "tool_calls": {"type": "array", "items": call},
        },
        ("role", "content"),
    )
    choice = {"index": integer(0), "finish_reason": FINISH}
    text_choice = choice | {"text": {"type": "string"}, "logprobs": nullable(ref("CompletionLogprobs"))}
    chat_choice = choice | {"message": message, "logprobs": nullable(ref("ChatLogprobs"))}
    every = ("id", "object", "created", "model", "choices", "usage")

    def body(kind: str, one: dict[str, Any], needed: tuple[str, ...]) -> dict[str, Any]:
        items = obj(one, ("index", "finish_reason", "logprobs", *needed))
        return obj(
            base | {"object": {"const": kind}, "choices": {"type": "array", "items": items}, "usage": usage}, every
        )

    return {
        "Completion": body("text_completion", text_choice, ("text",)),
        "ChatCompletion": body("chat.completion", chat_choice, ("message",)),
        "CompletionLogprobs": completion_logprobs,
        "ChatLogprobs": chat_logprobs,
        "ModelList": obj(
            {"object": {"const": "list"}, "data": {"type": "array", "items": _card()}}, ("object", "data")
        ),
        "Health": obj({"status": {"type": "string"}, "error": {"type": "string"}}, ("status",)),
        "Error": obj({"error": _error()}, ("error",)),
    }


def _card() -> dict[str, Any]:
    """One model of /v1/models."""
    return obj(
        {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "max_model_len": integer(1),
        },
        ("id", "object", "created", "owned_by"),
    )


def _error() -> dict[str, Any]:
    """OpenAI's error object."""
    return obj(
        {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"]},
        },
        ("message", "type", "param", "code"),
    )
