"""The OpenAPI 3.1 description of `hybridrt serve`'s routes, served at GET /openapi.json.

Plain data (no framework): request bodies as JSON schemas with the bounds that protocol.py and
chat.py check (the served model's name, max length and vocabulary fill them in), responses
with OpenAI's shapes, every error with OpenAI's {"error": {...}} body.

What a JSON schema cannot say, the server checks on top: a prompt's tokens plus max_tokens
within the model's max length, prompts x n at most MAX_CHOICES, max_tokens 0 only with echo,
min_tokens at most max_tokens, top_logprobs only with logprobs: true, a response_format
schema that compiles, tool names unique, a named tool_choice among tools.
"""

from __future__ import annotations

from typing import Any

from .chat import ROLES
from .logprobs import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS
from .openapi_schemas import integer, needs, nullable, obj, ref, response_schemas
from .protocol import MAX_CHOICES, MAX_STOPS

ERRORS = {
    400: "a request the client can fix (unknown field, bad value, prompt too long)",
    401: "missing or wrong API key",
    404: "unknown model",
    413: "request body too large",
    429: "too many requests waiting; retry after Retry-After seconds",
    503: "the model is loading, failed to load, or the server is shutting down",
    504: "the request took longer than the server's request timeout",
    500: "generation failed",
}


def common(name: str, max_length: int | None) -> dict[str, Any]:
    """Fields of both request bodies (protocol.COMMON, and response_format)."""
    top = None if max_length is None else max_length - 1
    return {
        "model": {"type": "string", "enum": [name], "description": "the served model (GET /v1/models)"},
        "max_tokens": nullable(integer(1, top) | {"description": "new tokens at most (0 only with echo)"}),
        "min_tokens": nullable(integer(0, top)),
        "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2, "description": "0: greedy"}),
        "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": nullable(integer(-1) | {"description": "-1 or 0: off"}),
        "n": nullable(integer(1, MAX_CHOICES)),
        "stream": nullable({"type": "boolean"}),
        "stream_options": nullable(
            obj(
                {
                    "include_usage": nullable({"type": "boolean"}),
                    "continuous_usage_stats": nullable({"type": "boolean"}),
                },
                closed=True,
            )
        ),
        "ignore_eos": nullable({"type": "boolean"}),
        "stop": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOPS},
                {"type": "null"},
            ]
        },
        "seed": nullable(integer(0, 2**63 - 1)),
        "presence_penalty": nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "frequency_penalty": nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "repetition_penalty": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 100}),
        "user": nullable({"type": "string"}),
        "logit_bias": nullable({"type": "object", "maxProperties": 0, "description": "not supported: {} only"}),
        "response_format": nullable(response_format()),
    }


def named_schema(name: dict[str, Any], field: str, description: str) -> dict[str, Any]:
    """A name, a description, a JSON schema under `field` and `strict`, as OpenAI's response
    format (json_schema) and tool (function) spell them."""
    schema = {"type": "object", "description": description}
    properties = {
        "name": name,
        "description": {"type": "string"},
        field: schema,
        "strict": nullable({"type": "boolean"}),
    }
    return obj(properties, ("name",), closed=True)


def response_format() -> dict[str, Any]:
    """text, json_object, or json_schema: the reply is decoded under the schema (grammar.py)."""
    kind = {"type": "string", "enum": ["text", "json_object"]}
    spec = named_schema({"type": "string"}, "schema", "a JSON schema the reply is valid against")
    schema = obj({"type": {"const": "json_schema"}, "json_schema": spec}, ("type", "json_schema"), closed=True)
    return {"anyOf": [obj({"type": kind}, ("type",), closed=True), schema]}


def tools() -> dict[str, Any]:
    """Request fields of function calling (tools.py)."""
    name = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}
    function = named_schema(name, "parameters", "a JSON schema of the arguments")
    tool = obj({"type": {"const": "function"}, "function": function}, ("type", "function"), closed=True)
    named = obj(
        {"type": {"const": "function"}, "function": obj({"name": name}, ("name",), closed=True)},
        ("type", "function"),
        closed=True,
    )
    choice = {"type": "string", "enum": ["none", "auto", "required"]}
    return {
        "tools": nullable({"type": "array", "items": tool}),
        "tool_choice": {
            "anyOf": [choice, named, {"type": "null"}],
            "description": "required and a named function are enforced by constrained decoding; a name must be "
            "among tools, and required needs tools",
        },
        "parallel_tool_calls": nullable({"type": "boolean"}),
    }


def completion_request(name: str, max_length: int | None, vocab: int | None) -> dict[str, Any]:
    top = None if max_length is None else max_length - 1
    ids = {"type": "array", "minItems": 1, "items": integer(0, None if vocab is None else vocab - 1)}
    if top is not None:
        ids["maxItems"] = top
    text = {"type": "string", "minLength": 1}
    prompt = {
        "anyOf": [
            text,
            {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES, "items": text},
            ids,
            {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES, "items": ids},
        ],
        "description": "a text, a list of texts, token ids, or a list of token-id lists",
    }
    props = common(name, max_length) | {
        "prompt": prompt,
        "max_tokens": nullable(integer(0, top) | {"description": "new tokens at most (default 16; 0 only with echo)"}),
        "echo": nullable({"type": "boolean", "description": "return the prompt before the completion"}),
        "logprobs": nullable(integer(0, MAX_COMPLETION_LOGPROBS) | {"description": "alternatives per token"}),
        "best_of": nullable(integer(1, 1)),
        "suffix": nullable({"type": "string", "maxLength": 0}),
    }
    return obj(props, ("model", "prompt"), closed=True) | needs("max_tokens", {"const": 0}, "echo", True)


def chat_request(name: str, max_length: int | None) -> dict[str, Any]:
    top = None if max_length is None else max_length - 1
    part = obj({"type": {"const": "text"}, "text": {"type": "string"}}, ("type", "text"))
    content = {"anyOf": [{"type": "string"}, {"type": "array", "items": part}]}
    arguments = {"type": ["string", "object"], "description": "JSON text or its object"}
    call = obj({"function": obj({"name": {"type": "string"}, "arguments": arguments}, ("name",))}, ("function",))
    plain = obj({"role": {"type": "string", "enum": list(ROLES)}, "content": content}, ("role", "content"))
    calls = obj(
        {
            "role": {"const": "assistant"},
            "content": {"anyOf": [content, {"type": "null"}]},
            "tool_calls": {"type": "array", "minItems": 1, "items": call},
        },
        ("role", "tool_calls"),
    )
    message = {"anyOf": [plain, calls], "description": "a tool message's tool_call_id and name go to the template"}
    props = (
        common(name, max_length)
        | {
            "messages": {"type": "array", "minItems": 1, "items": message},
            "max_completion_tokens": nullable(integer(1, top)),
            "logprobs": nullable({"type": "boolean"}),
            "top_logprobs": nullable(integer(0, MAX_TOP_LOGPROBS) | {"description": "with logprobs: true only"}),
        }
        | tools()
    )
    return obj(props, ("model", "messages"), closed=True) | needs("top_logprobs", {"type": "integer"}, "logprobs", True)


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): _json(ref("Error"), ERRORS[c]) for c in codes}


def _generate(summary: str, request: str, response: str) -> dict[str, Any]:
    stream = obj(  # one event (OpenAPI 3.1: the schema of each event of a stream)
        {"data": {"type": "string"}, "event": {"type": "string"}},
        ("data",),
    ) | {"description": "server-sent events (stream: true): data is a chunk's JSON, the last one [DONE]"}
    ok = _json(ref(response), "the whole response, or with stream: true its chunks as server-sent events")
    ok["content"]["text/event-stream"] = {"schema": stream}
    body = {"required": True, "content": {"application/json": {"schema": ref(request)}}}
    responses = {"200": ok} | _errors(400, 401, 404, 413, 429, 500, 503, 504)
    return {"post": {"summary": summary, "operationId": request, "requestBody": body, "responses": responses}}


def spec(name: str, max_length: int | None = None, vocab: int | None = None, api_key: bool = True) -> dict[str, Any]:
    """The description of the server of model `name` (max length and vocabulary: its bounds,
    left open while the model loads); with `api_key`, every route but /health and this one
    needs `Authorization: Bearer KEY`."""
    public: list[dict[str, Any]] = []  # no API key
    health = {"200": _json(ref("Health"), "ready"), "503": _json(ref("Health"), "loading, failed or stopping")}
    metrics = {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    }
    paths = {
        "/health": {"get": {"summary": "Readiness", "operationId": "health", "security": public, "responses": health}},
        "/metrics": {
            "get": {"summary": "Prometheus metrics", "operationId": "metrics", "responses": metrics | _errors(401)}
        },
        "/openapi.json": {
            "get": {
                "summary": "This description",
                "operationId": "openapi",
                "security": public,
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
            }
        },
        "/v1/models": {
            "get": {
                "summary": "The served model",
                "operationId": "models",
                "responses": {"200": _json(ref("ModelList"), "one model")} | _errors(401, 503),
            }
        },
        "/v1/completions": _generate("Text completion", "CompletionRequest", "Completion"),
        "/v1/chat/completions": _generate("Chat completion", "ChatCompletionRequest", "ChatCompletion"),
    }
    schemas = response_schemas() | {
        "CompletionRequest": completion_request(name, max_length, vocab),
        "ChatCompletionRequest": chat_request(name, max_length),
    }
    out: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "hybridrt serve", "version": _version(), "description": __doc__.split("\n\n")[0]},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if api_key:
        out["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        out["security"] = [{"bearer": []}]
    return out


def _version() -> str:
    from .._version import __version__

    return str(__version__)
