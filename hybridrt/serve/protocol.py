"""OpenAI request bodies in, checked parameters out; every problem is an ApiError (a 4xx with
OpenAI's {"error": {...}} body), never an exception that reaches the client as a 500.

Parameter mapping onto GenerationConfig: max_tokens (chat also max_completion_tokens) ->
max_new_tokens; min_tokens -> min_new_tokens; temperature 0 (below 1e-5, as vLLM: smaller ones
overflow the scaled logits) -> greedy, otherwise sampling (OpenAI's default is 1); top_p, top_k
(-1 or 0 = off), seed, stop -> stop_strings (cut from the text, as OpenAI does),
repetition_penalty (default: the model's recommended one, from its generation_config.json);
presence_penalty, frequency_penalty (over the generated tokens, as OpenAI).

Logprobs (hybridrt.serve.logprobs): /v1/completions takes `logprobs` (0-5 alternatives per
token) and `echo` (the prompt's text before the completion, and with `logprobs` the prompt
tokens' logprobs too; `max_tokens: 0` with echo scores the prompt and generates nothing);
/v1/chat/completions takes `logprobs: true` and `top_logprobs` (0-20).

Structured output: `response_format` (both routes) and forced tool calls (chat) become a
grammar constraint (hybridrt.serve.grammar) that `hybridrt serve` and the Lambda handler
decode under.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import GenerationError
from ..runtime.sampling import GenerationConfig
from .api_error import ApiError as ApiError  # the error of every check here, re-exported
from .grammar import Constraint, response_constraint
from .logprobs import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS

if TYPE_CHECKING:
    from ..runtime.model import Model
    from .tools import Tools

MAX_CHOICES = 16  # prompts x n in one request
MAX_STOPS = 4
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
GREEDY_BELOW = 1e-5  # temperatures below this decode greedily


@dataclass(frozen=True)
class Params:
    """One request's work: token rows (one per prompt), each run n times."""

    rows: list[list[int]]
    cfg: GenerationConfig
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None = None  # alternatives per token (None: no logprobs)
    echo: tuple[str, ...] | None = None  # each prompt's text, returned before its completion
    score_only: bool = False  # max_tokens 0 (with echo): the prompt is scored, nothing generated
    constraint: Constraint | None = None  # the grammar every choice is decoded under
    tools: Tools | None = None  # functions whose calls are parsed from the reply
    continuous_usage: bool = False  # usage so far in every streamed chunk (vLLM's continuous_usage_stats)

    @property
    def prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token, when the prompt is scored (echo with logprobs)."""
        return self.logprobs if self.echo is not None else None

    def choices(self) -> list[tuple[list[int], GenerationConfig]]:
        """(prompt row, settings) of each choice, prompt-major: choice j of a prompt samples with
        seed + j, so that the n choices of a seeded request differ and each is reproducible."""
        out = []
        for row in self.rows:
            for j in range(self.n):
                cfg = self.cfg
                if cfg.seed is not None and j:
                    cfg = replace(cfg, seed=(cfg.seed + j) % 2**63)
                out.append((row, cfg))
        return out


# include_usage: a last chunk with the usage; continuous_usage_stats (vLLM): the usage so far in every chunk.
STREAM_OPTIONS = {"include_usage", "continuous_usage_stats"}
COMMON = {
    "model",
    "max_tokens",
    "min_tokens",
    "ignore_eos",
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
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "best_of", "suffix", "response_format"}
CHAT_FIELDS = COMMON | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
}


# Fields that only their neutral values (or null) may take here.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (1,),
    "suffix": ("",),
    "logit_bias": ({},),
}


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


def check_fields(
    body: dict[str, Any],
    known: set[str],
    served: str | Sequence[str],
    unsupported: dict[str, tuple[Any, ...]] = UNSUPPORTED,
) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(400, f"unrecognized request argument: {', '.join(unknown)[:200]}", unknown[0])
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "model is required: a string naming the model (GET /v1/models lists it)", "model")
    names = [served] if isinstance(served, str) else list(served)
    if model not in names:
        listed = repr(names[0]) if len(names) == 1 else ", ".join(map(repr, names))
        raise ApiError(
            404, f"the model {model[:100]!r} does not exist; this server serves {listed}", "model", "model_not_found"
        )
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError(400, f"user must be a string, got {_show(body['user'])}", "user")
    for name, neutral in unsupported.items():
        value = body.get(name)
        if value is not None and not any(type(_whole(value)) is type(v) and value == v for v in neutral):
            raise ApiError(400, f"{name} is not supported by this server", name)


def completion_params(model: Model, body: dict[str, Any]) -> Params:
    """A /v1/completions request's work on `model`: its prompt tokenized (text, token ids, or a
    list of either; text gets <s> where the model asks for it)."""
    try:
        rows = model.prompt_rows(_ids(body.get("prompt"))).rows
    except GenerationError as e:
        raise ApiError(400, str(e), "prompt") from None
    echo = _bool(body, "echo", False)
    logprobs = body.get("logprobs")
    logprobs = None if logprobs is None else _int(body, "logprobs", 0, 0, MAX_COMPLETION_LOGPROBS)
    constraint = response_constraint(body.get("response_format"))
    p = params(body, rows, model.max_length, COMPLETION_DEFAULT_MAX_TOKENS, model.manifest.generation, echo)
    echoed = echo_texts(model, body["prompt"], rows) if echo else None
    return replace(p, logprobs=logprobs, echo=echoed, constraint=constraint)


def logprobs_asked(body: dict[str, Any]) -> int | None:
    """A chat request's `logprobs` (true/false) and `top_logprobs` (0-20, with logprobs only):
    the alternatives per token, or None for no logprobs."""
    top = body.get("top_logprobs")
    if not _bool(body, "logprobs", False):
        if top is not None:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)


def echo_texts(model: Model, prompt: Any, rows: list[list[int]]) -> tuple[str, ...]:
    """Each prompt's text as echo returns it: text prompts as sent, token ids decoded."""
    if isinstance(prompt, str):
        return (prompt,)
    if all(isinstance(p, str) for p in prompt):
        return tuple(prompt)
    from ..runtime.text import decode

    return tuple(decode(model.tokenizer, row) if model.tokenizer is not None else "" for row in rows)


def _max_tokens(
    body: dict[str, Any], rows: list[list[int]], max_length: int, default_max: int | None, echo: bool
) -> tuple[str, int]:
    """The field that sets the reply's length (max_completion_tokens over max_tokens) and its
    value, within the room the longest prompt leaves in the model's max length."""
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
    if name != "max_tokens":  # max_tokens is then ignored, but must still be a possible value
        _int(body, "max_tokens", 1, 1, max_length - 1)
    max_tokens = _int(body, name, room if default_max is None else min(default_max, room), 0 if echo else 1, None)
    if longest + max_tokens > max_length:
        raise ApiError(
            400,
            f"prompt ({longest} tokens) + {name} ({max_tokens}) exceeds the model's max length {max_length}",
            name,
            "context_length_exceeded",
        )
    return name, max_tokens


def params(
    body: dict[str, Any],
    rows: list[list[int]],
    max_length: int,
    default_max: int | None,
    recommended: dict[str, Any] | None = None,
    echo: bool = False,
) -> Params:
    """Generation parameters for `rows` (already tokenized), checked against the model's length;
    `recommended` (the manifest's generation settings) gives the repetition penalty's default;
    with `echo`, max_tokens may be 0 (the prompt is scored, nothing generated)."""
    name, max_tokens = _max_tokens(body, rows, max_length, default_max, echo)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_k = _int(body, "top_k", -1, -1, None)
    seed = body.get("seed")
    kwargs = dict(
        max_new_tokens=max(max_tokens, 1),
        # ignore_eos (vLLM's extension; load tools send it to fix the output length): the
        # end-of-sequence token is never chosen, so every choice runs to max_tokens.
        min_new_tokens=max_tokens if _bool(body, "ignore_eos", False) else _int(body, "min_tokens", 0, 0, max_tokens),
        do_sample=temperature >= GREEDY_BELOW,
        temperature=temperature if temperature >= GREEDY_BELOW else None,
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=top_k if top_k > 0 else None,
        repetition_penalty=_number(
            body, "repetition_penalty", (recommended or {}).get("repetition_penalty", 1.0), 0.0, 100.0, low_open=True
        ),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
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
    if options is not None and (not isinstance(options, dict) or set(options) - STREAM_OPTIONS):
        raise ApiError(400, f"stream_options takes only {' and '.join(sorted(STREAM_OPTIONS))}", "stream_options")
    return Params(
        rows,
        cfg,
        n,
        stream,
        bool(options and _bool(options, "include_usage", False)),
        score_only=max_tokens == 0,
        continuous_usage=bool(options and _bool(options, "continuous_usage_stats", False)),
    )


def _int(body: dict[str, Any], name: str, default: int, low: int, high: int | None) -> int:
    value = _whole(body.get(name))
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {_show(value)}", name)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ApiError(400, f"{name} must be {bound}, got {_show(value)}", name)
    return value


def _whole(value: Any) -> Any:
    """An integral float (JSON's 5.0, which JSON schema counts as an integer) as an int."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _ids(prompt: Any) -> Any:
    """A prompt with integral floats in its token-id lists as ints."""
    if not isinstance(prompt, list):
        return prompt
    return [_ids(p) if isinstance(p, list) else _whole(p) for p in prompt]


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
