"""OpenAI request bodies in, checked parameters out; every problem is an ApiError (a 4xx with
OpenAI's {"error": {...}} body), never an exception that reaches the client as a 500.

Parameter mapping onto GenerationConfig: max_tokens (chat also max_completion_tokens) ->
max_new_tokens; min_tokens -> min_new_tokens; temperature 0 -> greedy, otherwise sampling
(OpenAI's default is temperature 1); top_p, top_k (-1 or 0 = off), seed, stop ->
stop_strings (cut from the text, as OpenAI does), repetition_penalty (default: the model's recommended
one, from its generation_config.json); presence_penalty and
frequency_penalty are applied by the engine over the generated tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import GenerationError, HybridrtError
from ..runtime.sampling import GenerationConfig

MAX_CHOICES = 16  # prompts x n in one request
MAX_STOPS = 4


class ApiError(HybridrtError):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers: dict[str, str] = headers or {}

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(self.status)
        if kind is None:
            kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


FAILURES = ("timeout", "error", "cancelled")  # finish reasons that are not a normal end


def failure(reason: str | None, error: str | None) -> ApiError:
    """The error for a request that ended in one of FAILURES."""
    if reason == "timeout":
        return ApiError(504, "the request took longer than the server's request timeout", code="timeout")
    if reason == "cancelled":
        return ApiError(503, "the server is shutting down", code="cancelled")
    return ApiError(500, f"generation failed: {error}", code="engine_error")


@dataclass(frozen=True)
class Params:
    """One request's work: token rows (one per prompt), each run n times."""

    rows: list[list[int]]
    cfg: GenerationConfig
    n: int
    stream: bool
    include_usage: bool
    presence_penalty: float
    frequency_penalty: float


COMMON = {
    "model",
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "user",
    "logprobs",
    "logit_bias",
}
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "response_format"}


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {e.start})") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def check_fields(body: dict[str, Any], known: set[str], model_name: str) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, f"unrecognized request argument: {', '.join(unknown)[:200]}", unknown[0])
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "model is required: a string naming the model (GET /v1/models lists it)", "model")
    if model != model_name:
        raise ApiError(
            404,
            f"the model {model[:100]!r} does not exist; this server serves {model_name!r}",
            "model",
            "model_not_found",
        )
    unsupported = {
        "echo": False,
        "best_of": 1,
        "suffix": None,
        "logprobs": None,
        "top_logprobs": None,
        "logit_bias": None,
        "tools": None,
        "tool_choice": None,
        "response_format": None,
    }
    for name, neutral in unsupported.items():
        value = body.get(name)
        if value not in (neutral, None, False, {}, []) and not (name == "response_format" and _is_text(value)):
            raise ApiError(400, f"{name} is not supported by this server", name)


def _is_text(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "text"


def params(
    body: dict[str, Any],
    rows: list[list[int]],
    max_length: int,
    default_max: int | None,
    recommended: dict[str, Any] | None = None,
) -> Params:
    """Generation parameters for `rows` (already tokenized), checked against the model's length;
    `recommended` (the manifest's generation settings) gives the repetition penalty's default."""
    longest = max(len(r) for r in rows)
    room = max_length - longest
    if room < 1:
        raise ApiError(
            400,
            f"the prompt has {longest} tokens; the model's max length is {max_length}",
            "messages" if "messages" in body else "prompt",
            "context_length_exceeded",
        )
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name, room if default_max is None else min(default_max, room), 1, None)
    if longest + max_tokens > max_length:
        raise ApiError(
            400,
            f"prompt ({longest} tokens) + {name} ({max_tokens}) exceeds the model's max length {max_length}",
            name,
            "context_length_exceeded",
        )
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_k = _int(body, "top_k", -1, -1, None)
    seed = body.get("seed")
    kwargs = dict(
        max_new_tokens=max_tokens,
        min_new_tokens=_int(body, "min_tokens", 0, 0, max_tokens),
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=top_k if top_k > 0 else None,
        repetition_penalty=_number(
            body, "repetition_penalty", (recommended or {}).get("repetition_penalty", 1.0), 0.0, 100.0, low_open=True
        ),
        seed=None if seed is None else _int(body, "seed", 0, 0, 2**63 - 1),
        stop_strings=_stops(body.get("stop")),
    )
    try:
        cfg = GenerationConfig.from_kwargs(**kwargs)
    except GenerationError as e:
        raise ApiError(400, str(e)) from None
    n = _int(body, "n", 1, 1, MAX_CHOICES)
    if n * len(rows) > MAX_CHOICES:
        raise ApiError(400, f"{len(rows)} prompts x n={n} exceeds {MAX_CHOICES} choices per request", "n")
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise ApiError(400, "stream_options must be an object with at most include_usage", "stream_options")
    return Params(
        rows,
        cfg,
        n,
        stream,
        bool(options and _bool(options, "include_usage", False)),
        _number(body, "presence_penalty", 0.0, -2.0, 2.0),
        _number(body, "frequency_penalty", 0.0, -2.0, 2.0),
    )


def _int(body: dict[str, Any], name: str, default: int, low: int, high: int | None) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {_show(value)}", name)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ApiError(400, f"{name} must be {bound}, got {_show(value)}", name)
    return value


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"{name} must be a number, got {_show(value)}", name)
    if value < low or value > high or (low_open and value == low):
        raise ApiError(400, f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {_show(value)}", name)
    return float(value)


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {_show(value)}", name)
    return value


def _stops(value: Any) -> list[str] | None:
    stops = [value] if isinstance(value, str) else value
    if stops is None or stops == []:
        return None
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them", "stop")
    return stops


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
