"""An AWS Lambda handler with the routes and bodies of `hybridrt serve`, for API Gateway HTTP APIs
and Lambda function URLs (event payload format 2.0).

Routes: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions. One request
per invocation, generated directly on the model (no engine thread, no prefix cache); request
parsing and the parameter mapping are protocol.py's and chat.py's, as in app.py. `stream: true`
is answered with the whole event stream in one buffered `text/event-stream` body (a Lambda
response is not streamed): each choice's text in one chunk, then the usage chunk when
stream_options.include_usage asks for it, then `data: [DONE]`. presence_penalty and
frequency_penalty (applied by the serve engine) are refused here with a 400 unless 0.

Runtime-only: imports neither torch nor the `serve` extra (starlette, uvicorn, prometheus_client,
jinja2). A model whose tokenizer config has its own chat template needs jinja2 in the deployment;
the default template is rendered without it.

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

import base64
import binascii
import dataclasses
import hmac
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import GenerationError, GraphError
from .chat import DEFAULT_CHAT_TEMPLATE, ROLES, check_messages, template_source
from .config import ServeConfig
from .protocol import CHAT_FIELDS, COMPLETION_FIELDS, ApiError, Params, check_fields, params, parse_json

COMPLETION_DEFAULT_MAX_TOKENS = 16  # as app.py: OpenAI's default for /v1/completions
ROUTES = {
    "/health": "GET",
    "/v1/models": "GET",
    "/v1/completions": "POST",
    "/v1/chat/completions": "POST",
}
VERIFY_MODES = ("sha256", "size", "none")
JSON_TYPE = "application/json"


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
    """The Lambda entry point: a payload 2.0 event in, a payload 2.0 response out."""
    try:
        return _handle(event)
    except ApiError as e:
        return _json(e.status, e.body(), e.headers)
    except Exception:  # no stack trace reaches the client; Lambda's log gets it
        import logging

        logging.getLogger("hybridrt.serve").exception("request failed")
        return _json(500, ApiError(500, "internal server error", code="internal_error").body())


def _handle(event: Any) -> dict[str, Any]:
    method, path, headers = _request(event)
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
            return _json(503, {"status": "failed", "error": str(e)})
        return _json(200, {"status": "ok"})
    state = _model()
    if path == "/v1/models":
        card = {
            "id": state.name,
            "object": "model",
            "created": state.created,
            "owned_by": "hybridrt",
            "max_model_len": state.model.max_length,
        }
        return _json(200, {"object": "list", "data": [card]})
    body = _body(event, CHAT_FIELDS if path == "/v1/chat/completions" else COMPLETION_FIELDS, state.name)
    if path == "/v1/completions":
        return _completions(state, body)
    return _chat(state, body)


def _request(event: Any) -> tuple[str, str, dict[str, str]]:
    if not isinstance(event, dict) or event.get("version") != "2.0":
        raise ApiError(400, "the event is not an API Gateway HTTP API / function URL event (payload format 2.0)")
    http = (event.get("requestContext") or {}).get("http") if isinstance(event.get("requestContext"), dict) else None
    if not isinstance(http, dict) or not isinstance(http.get("method"), str):
        raise ApiError(400, "the event has no requestContext.http.method")
    path = event.get("rawPath", http.get("path"))
    if not isinstance(path, str):
        raise ApiError(400, "the event has no rawPath")
    headers = event.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ApiError(400, "the event's headers must be an object of strings")
    path = path.rstrip("/") or "/"
    return http["method"].upper(), path, {str(k).lower(): v for k, v in headers.items()}


def _body(event: dict[str, Any], known: set[str], model_name: str) -> dict[str, Any]:
    raw = event.get("body")
    if raw is None:
        raise ApiError(400, "the request has no body: send a JSON object")
    if not isinstance(raw, str):
        raise ApiError(400, "the event's body must be a string")
    encoded = event.get("isBase64Encoded", False)
    if not isinstance(encoded, bool):
        raise ApiError(400, "the event's isBase64Encoded must be true or false")
    if encoded:
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "the request body is not valid base64 (isBase64Encoded is true)") from None
    else:
        data = raw.encode("utf-8", "surrogatepass")
    limit = ServeConfig.max_body_bytes
    if len(data) > limit:
        raise ApiError(413, f"the request body exceeds {limit} bytes")
    body = parse_json(data)
    check_fields(body, known, model_name)
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0) and not isinstance(body.get(name), bool):
            raise ApiError(400, f"{name} is not supported by the Lambda handler (use hybridrt serve)", name)
    return body


def _model() -> Loaded:
    try:
        return load_model()
    except Exception as e:
        raise ApiError(503, f"the model failed to load: {e}") from None


def _completions(state: Loaded, body: dict[str, Any]) -> dict[str, Any]:
    model = state.model
    try:
        rows = model.prompt_rows(body.get("prompt")).rows  # text gets <s> where the model asks for it
    except GenerationError as e:
        raise ApiError(400, str(e), "prompt") from None
    p = params(body, rows, model.max_length, COMPLETION_DEFAULT_MAX_TOKENS, model.manifest.generation)
    return _run(state, p, chat=False)


def _chat(state: Loaded, body: dict[str, Any]) -> dict[str, Any]:
    model = state.model
    messages = check_messages(body.get("messages"))
    if state.template is None:
        state.template = chat_template(model.path)
    try:
        rows = model.prompt_rows(state.template.render(messages)).rows
    except GenerationError as e:
        raise ApiError(400, str(e), "messages") from None
    p = params(body, rows, model.max_length, None, model.manifest.generation)
    return _run(state, p, chat=True)


class PlainDefaultTemplate:
    """chat.DEFAULT_CHAT_TEMPLATE rendered in Python, for deployments without jinja2."""

    source = DEFAULT_CHAT_TEMPLATE

    def render(self, messages: list[dict[str, str]]) -> str:
        assert all(m["role"] in ROLES for m in messages)
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def chat_template(directory: Path) -> Any:
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
    from .chat import ChatTemplate

    return ChatTemplate(source, special)


@dataclasses.dataclass
class Choice:
    index: int
    text: str
    tokens: int
    finish_reason: str


def _run(state: Loaded, p: Params, chat: bool) -> dict[str, Any]:
    from ..runtime.decode import GenerationStats
    from ..runtime.text import decode

    model = state.model
    choices: list[Choice] = []
    try:
        for row in p.rows:
            model.check_length([row], p.cfg)
            for j in range(p.n):
                cfg = p.cfg
                if cfg.seed is not None and j:  # as the engine: choice j of a prompt samples with seed + j
                    cfg = dataclasses.replace(cfg, seed=(cfg.seed + j) % 2**63)
                stats = GenerationStats()
                stepper = model._new_stepper(1, model.capacity_for([row], cfg))
                for _ in model._steps(stepper, [row], cfg, stats):
                    pass
                tokens = stats.tokens[0]
                text = decode(model.tokenizer, tokens) if model.tokenizer is not None else ""
                cut = [i for i in (text.find(s) for s in cfg.stops) if i >= 0]
                stopped = bool(cut) or (bool(tokens) and tokens[-1] in cfg.eos_ids(model.eos_token_ids))
                reason = "stop" if stopped else "length"
                choices.append(Choice(len(choices), text[: min(cut)] if cut else text, len(tokens), reason))
    except GenerationError as e:
        raise ApiError(400, str(e)) from None
    prompt = sum(len(r) for r in p.rows)  # each prompt once, as OpenAI
    completion = sum(c.tokens for c in choices)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    meta = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": state.name,
    }
    if p.stream:
        return _events(meta, chat, choices, usage if p.include_usage else None)
    body = {**meta, "object": "chat.completion" if chat else "text_completion"}
    body["choices"] = [_choice(c, chat, c.text, delta=False) for c in choices]
    body["usage"] = usage
    return _json(200, body)


def _choice(c: Choice, chat: bool, text: str, delta: bool, finish: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"index": c.index}
    if not chat:
        out["text"] = text
    elif delta:
        out["delta"] = {"content": text} if text else {}
    else:
        out["message"] = {"role": "assistant", "content": text}
    out["logprobs"] = None
    out["finish_reason"] = c.finish_reason if finish else None
    return out


def _events(meta: dict[str, Any], chat: bool, choices: list[Choice], usage: Any) -> dict[str, Any]:
    """The buffered SSE body: what `hybridrt serve` streams, one text chunk per choice."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(chunk_choices: list[dict[str, Any]], usage: Any = None) -> str:
        body = {**meta, "object": kind, "choices": chunk_choices}
        if usage is not None:
            body["usage"] = usage
        return "data: " + json.dumps(body, ensure_ascii=False) + "\n\n"

    parts = []
    if chat:
        role = [
            {"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for c in choices
        ]
        parts.append(event(role))
    parts += [event([_choice(c, chat, c.text, delta=True)]) for c in choices]
    if usage is not None:
        parts.append(event([], usage))
    parts.append("data: [DONE]\n\n")
    headers = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
    return {"statusCode": 200, "headers": headers, "body": "".join(parts), "isBase64Encoded": False}


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    out = {"content-type": JSON_TYPE} | {k.lower(): v for k, v in (headers or {}).items()}
    return {
        "statusCode": status,
        "headers": out,
        "body": json.dumps(body, ensure_ascii=False),
        "isBase64Encoded": False,
    }


if os.environ.get("HYBRIDRT_LOAD_AT_IMPORT", "1") != "0" and (
    os.environ.get("HYBRIDRT_MODEL") or os.environ.get("LAMBDA_TASK_ROOT")
):
    try:
        load_model()  # in Lambda's init phase; a failure is reported by the first request
    except Exception:
        pass
