"""An AWS Lambda handler with the routes and bodies of `hybridrt serve`, for API Gateway HTTP APIs
and Lambda function URLs (event payload format 2.0).

Routes: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions. One request
per invocation, generated directly on the model (no engine thread, no prefix cache); request
parsing and the parameter mapping are protocol.py's and chat.py's, and the response bodies
openai.py's, as in app.py. `stream: true`
is answered with the whole event stream in one buffered `text/event-stream` body (a Lambda
response is not streamed): each choice's text in one chunk (with tools, its content and then
each call's deltas, as hybridrt serve streams them), then the usage chunk when
stream_options.include_usage asks for it, then `data: [DONE]`. Every sampling parameter,
presence_penalty and frequency_penalty among them, is the one sampler's (runtime.sampling).
`tools`/`tool_choice` and `response_format` are the server's (chat.py, tools.py, grammar.py):
a constrained choice is sampled as the serve engine samples a constrained row
(hybridrt.serve.request.Request), one decode step at a time under its grammar's mask.
`logprobs` (and echo's prompt logprobs) cost one more pass over the prompt and the generated
tokens with the logits of every position, after the generation: the same raw-logit logprobs
as the server's (hybridrt.serve.logprobs), up to float32 rounding.

Runtime-only: imports neither torch nor the `serve` extra (starlette, uvicorn, prometheus_client,
jinja2), except llguidance for constrained requests (which `hybridrt package-lambda` installs;
without it they are a 400 that names it). A model whose tokenizer config has its own chat
template needs jinja2 in the deployment; the default template is rendered without it.

Environment:
  HYBRIDRT_MODEL       exported model directory (relative paths from the working directory,
                       /var/task on Lambda), or "default" for the default model's cached export
                       (under $HYBRIDRT_CACHE); unset: $LAMBDA_TASK_ROOT/model where it exists.
  HYBRIDRT_MODEL_NAME  the model's name in requests and /v1/models (default "default").
  HYBRIDRT_API_KEY     when set, every route but /health needs `Authorization: Bearer KEY`.
  HYBRIDRT_VERIFY      "sha256" (default: every file's checksum against the manifest), "size"
                       (sizes only; for read-only deployments whose files are trusted) or "none".
  HYBRIDRT_THREADS     intra-op threads of the CPU provider (default: ONNX Runtime's choice).
  HYBRIDRT_LOAD_AT_IMPORT  "0" loads the model on the first invocation instead of at import
                       (the default loads it during Lambda's init phase).
The model is loaded once per container; a load that fails is retried on the next invocation.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import GenerationError, GenerationTimeout, GraphError
from ..serve import openai
from ..serve.chat import chat_params, chat_template
from ..serve.grammar import Matcher, matchers
from ..serve.logprobs import TokenText, rescore, shape
from ..serve.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    ApiError,
    Params,
    completion_params,
)
from ..serve.request_log import HEADER, LOGGER, RequestRecord, configure, request_id, write
from ..serve.tool_parse import CallParser
from ..serve.tools import with_markers
from .lambda_events import http_request, json_body, json_response

ROUTES = {
    "/health": "GET",
    "/v1/models": "GET",
    "/v1/completions": "POST",
    "/v1/chat/completions": "POST",
}
VERIFY_MODES = ("sha256", "size", "none")


@dataclasses.dataclass
class Loaded:
    model: Any
    name: str
    created: int
    template: Any = None  # the chat template, built on the first chat request


_lock = threading.Lock()
_state: Loaded | None = None


def model_path() -> Path:
    """The directory HYBRIDRT_MODEL names (see the module docstring)."""
    name = os.environ.get("HYBRIDRT_MODEL")
    if not name:
        root = os.environ.get("LAMBDA_TASK_ROOT")
        if root and (Path(root) / "model").is_dir():
            return Path(root) / "model"
        raise GraphError("HYBRIDRT_MODEL is not set: set it to the exported model directory (or 'default')")
    from ..default_model import is_default, model_dir

    return model_dir(name) if is_default(name) else Path(name)


def load_model() -> Loaded:
    """The container's model, loaded on the first call (thread-safe; a failure is not cached)."""
    global _state
    if _state is not None:
        return _state
    with _lock:
        if _state is None:
            _state = _load()
    return _state


def _load() -> Loaded:
    from ..graphs.manifest import read_manifest
    from ..runtime import load

    verify = os.environ.get("HYBRIDRT_VERIFY", "sha256").lower()
    if verify not in VERIFY_MODES:
        raise GraphError(f"HYBRIDRT_VERIFY must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    threads = os.environ.get("HYBRIDRT_THREADS")
    if threads is not None and not threads.isdigit():
        raise GraphError(f"HYBRIDRT_THREADS must be a positive integer, got {threads!r}")
    path = model_path()
    if verify == "size":
        check_sizes(path, read_manifest(path))
    model = load(path, "cpu", threads=int(threads) if threads else None, verify=verify == "sha256")
    return Loaded(model, os.environ.get("HYBRIDRT_MODEL_NAME", "default"), int(time.time()))


def check_sizes(directory: Path, manifest: Any) -> None:
    """Every file the manifest lists exists with its recorded size (no checksums)."""
    for name, info in manifest.files.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != info["bytes"]:
            raise GraphError(f"{path} is missing or has the wrong size for {directory}/manifest.json; re-export")


def handler(event: Any, context: Any = None) -> dict[str, Any]:
    """The Lambda entry point: a payload 2.0 event in, a payload 2.0 response out. Each
    invocation writes the server's request line (request_log.py) to Lambda's log, and a
    generation stops before the invocation's own deadline (`context`'s remaining time)."""
    record = _record(event, context)
    try:
        response = _handle(event, context, record)
    except ApiError as e:
        record.error = e.message
        response = json_response(e.status, e.body(), e.headers)
    except Exception as e:  # no stack trace reaches the client; Lambda's log gets it
        import logging

        logging.getLogger("hybridrt.serve").exception("request failed")
        record.error = f"internal server error: {type(e).__name__}: {e}"
        response = json_response(500, ApiError(500, "internal server error", code="internal_error").body())
    response["headers"] = dict(response.get("headers") or {}) | {HEADER: record.request_id}
    record.status = int(response["statusCode"])
    if not LOGGER.handlers:  # Lambda's log is its process's stderr; its root logger drops INFO
        configure()
    write(record, _log_prompts())
    return response


def _record(event: Any, context: Any) -> RequestRecord:
    """The invocation's log record: the client's X-Request-ID if usable, else Lambda's request id."""
    headers = event.get("headers") if isinstance(event, dict) else None
    given = None
    if isinstance(headers, dict):
        given = next((v for k, v in headers.items() if str(k).lower() == HEADER and isinstance(v, str)), None)
    rid = request_id(given.encode("latin-1", "replace") if given else None)
    if not given and getattr(context, "aws_request_id", None):
        rid = request_id(str(context.aws_request_id).encode("latin-1", "replace"))
    http = ((event.get("requestContext") or {}).get("http") or {}) if isinstance(event, dict) else {}
    method = str(http.get("method", "")) if isinstance(http, dict) else ""
    path = event.get("rawPath") if isinstance(event, dict) else None
    return RequestRecord(rid, method.upper(), path if isinstance(path, str) else "")


def _log_prompts() -> int:
    raw = os.environ.get("HYBRIDRT_LOG_PROMPTS", "0")
    return int(raw) if raw.isdigit() else 0


# Seconds kept back from the invocation's remaining time, to answer before Lambda stops it.
DEADLINE_MARGIN_S = 1.0


def _timeout(context: Any) -> float | None:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return None
    return max(0.001, remaining() / 1000 - DEADLINE_MARGIN_S)


def _handle(event: Any, context: Any, record: RequestRecord) -> dict[str, Any]:
    method, path, headers = http_request(event)
    want = ROUTES.get(path)
    if want is None:
        raise ApiError(404, f"Not Found: {method} {path[:200]}")
    if method != want:
        raise ApiError(405, f"Method Not Allowed: {method} {path[:200]}", headers={"Allow": want})
    key = os.environ.get("HYBRIDRT_API_KEY")
    if key and path != "/health":
        got = headers.get("authorization", "").encode()
        if not hmac.compare_digest(got, f"Bearer {key}".encode()):
            raise ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY", code="invalid_api_key")
    if path == "/health":
        try:
            load_model()
        except Exception as e:
            return json_response(503, {"status": "failed", "error": str(e)})
        return json_response(200, {"status": "ok"})
    state = _model()
    if path == "/v1/models":
        return json_response(200, openai.model_list([(state.name, state.model.max_length)], state.created))
    record.model = state.name
    if path == "/v1/completions":
        body = json_body(event, COMPLETION_FIELDS, state.name)
        return _run(state, completion_params(state.model, body), False, record, _timeout(context))
    body = json_body(event, CHAT_FIELDS, state.name)
    if state.template is None:
        state.template = chat_template(state.model.path)
    return _run(state, chat_params(state.model, state.template, body), True, record, _timeout(context))


def _model() -> Loaded:
    try:
        return load_model()
    except Exception as e:
        raise ApiError(503, f"the model failed to load: {e}") from None


def _run(state: Loaded, p: Params, chat: bool, record: RequestRecord, timeout: float | None) -> dict[str, Any]:
    from ..runtime.text import decode

    model = state.model
    if _log_prompts() and model.tokenizer is not None:
        record.prompt = model.tokenizer.decode(p.rows[0], skip_special_tokens=False)
    deadline = None if timeout is None else time.monotonic() + timeout
    finished: list[tuple[str, str, Any, list[Any] | None]] = []  # (text, finish reason, logprobs, call events)
    calls: list[list[dict[str, Any]] | None] = []
    completion = 0
    names = TokenText(model.tokenizer) if p.logprobs is not None else None
    todo = p.choices()
    grammars = [None] * len(todo) if p.constraint is None else matchers(model, p.constraint, len(todo))
    text_of = model.tokenizer if p.tools is None else with_markers(model.tokenizer)
    try:
        for i, ((row, cfg), grammar) in enumerate(zip(todo, grammars, strict=True)):
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            tokens, complete = ([], False) if p.score_only else _generate(model, row, cfg, grammar, left)
            text = decode(text_of, tokens) if model.tokenizer is not None else ""
            text, reason = openai.finish(text, tokens, cfg.stops, cfg.eos_ids(model.eos_token_ids))
            reason = openai.STOP if complete else reason
            echo = "" if p.echo is None else p.echo[i // p.n]
            lp = None if names is None else _logprobs(model, names, p, row, tokens, chat, echo)
            events, made = None, None
            if p.tools is not None:
                parser = CallParser(p.tools.names)
                events, text, made = parser.push(text) + parser.finish(), parser.content(), parser.calls
                reason = openai.TOOL_CALLS if made and reason == openai.STOP else reason
            calls.append(made)
            finished.append((echo + text, reason, lp, events))
            completion += len(tokens)
    except GenerationTimeout:
        record.counts = {"finish_reason": [r for _, r, _, _ in finished] + ["timeout"]}
        raise openai.failure("timeout", None) from None
    except GenerationError as e:
        raise ApiError(400, str(e)) from None
    usage = openai.usage(sum(len(r) for r in p.rows), completion)
    record.counts = {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": completion,
        "finish_reason": [r for _, r, _, _ in finished],
    }
    meta = openai.meta(chat, state.name)
    if p.stream:
        body = openai.event_stream(meta, chat, finished, usage if p.include_usage else None)
        headers = dict(openai.EVENT_STREAM_HEADERS)
        return {"statusCode": 200, "headers": headers, "body": body.decode(), "isBase64Encoded": False}
    choices = [
        openai.choice(i, chat, text, reason, logprobs=lp, tool_calls=calls[i] or None)
        for i, (text, reason, lp, _) in enumerate(finished)
    ]
    return json_response(200, openai.completion(meta, chat, choices, usage))


def _generate(
    model: Any, row: list[int], cfg: Any, grammar: Matcher | None, timeout: float | None = None
) -> tuple[list[int], bool]:
    """(a choice's new tokens, whether a grammar row stopped: its grammar complete, EOS or a
    stop string; False without a grammar, whose finish reason openai.finish tells). Under a
    grammar, the tokens are sampled as the serve engine samples a constrained row
    (hybridrt.serve.request.Request: the mask on the logits, the grammar fed every token), one
    decode step at a time."""
    if grammar is None:
        kwargs = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        return model.generate_with_stats(row, timeout=timeout, **kwargs)[1].tokens[0], False
    import numpy as np

    from ..runtime.decode import feed
    from ..serve.request import Request

    req = Request(row, cfg, lambda update: None, grammar=grammar)
    req.start(model.eos_token_ids, model.tokenizer, int(model.manifest.vocab_size))
    states = model.stepper(1, len(row) + cfg.max_new_tokens)
    logits = feed(states, np.asarray([row], dtype=np.int64))
    deadline = None if timeout is None else time.monotonic() + timeout
    while (reason := req.record(req.choose(logits)[0])) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise GenerationTimeout(f"generation passed its timeout after {len(req.tokens)} new tokens")
        logits = states.forward(np.asarray([req.tokens[-1:]], dtype=np.int64))
    return req.tokens, reason == "stop"  # the grammar complete, EOS or a stop string


def _logprobs(
    model: Any, names: TokenText, p: Params, row: list[int], tokens: list[int], chat: bool, echo: str
) -> dict[str, Any]:
    """A choice's logprobs, from one more pass over its prompt and tokens (see the module docstring)."""
    assert p.logprobs is not None
    entries = rescore(model.stepper(1, len(row) + len(tokens)), row + tokens, p.logprobs)
    prompt = entries[: len(row)] if p.echo is not None else []
    return shape(names, chat, prompt, entries[len(row) :], len(echo))


if os.environ.get("HYBRIDRT_LOAD_AT_IMPORT", "1") != "0" and (
    os.environ.get("HYBRIDRT_MODEL") or os.environ.get("LAMBDA_TASK_ROOT")
):
    try:
        load_model()  # in Lambda's init phase; a failure is reported by the first request
    except Exception:
        pass
