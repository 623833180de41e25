"""OpenAI's response bodies, built the same way for `hybridrt serve` (app.py, sse.py) and the
Lambda handler (aws_lambda.py): the model list, completion and chat completion bodies, their
stream chunks as server-sent events ending with `data: [DONE]`, usage, the finish reasons.

Framework-free: plain dicts and bytes, no starlette, anyio or torch. Request parsing is
protocol.py's.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from .protocol import ApiError

STOP, LENGTH = "stop", "length"  # a normal end: EOS or a stop string; max_tokens reached
TOOL_CALLS = "tool_calls"  # a normal end in which the model called tools (hybridrt.serve.tools)
FAILURES = ("timeout", "error", "cancelled", "slow_client")  # finish reasons that are not a normal end
DONE = b"data: [DONE]\n\n"
EVENT_STREAM_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


def failure(reason: str | None, error: str | None) -> ApiError:
    """The error for a request that ended in one of FAILURES."""
    if reason == "timeout":
        return ApiError(504, "the request took longer than the server's request timeout", code="timeout")
    if reason == "cancelled":
        return ApiError(503, "the server is shutting down", code="cancelled")
    if reason == "slow_client":
        message = "the client read the stream too slowly: it was ended to free its slot"
        return ApiError(408, message, code="slow_client")
    return ApiError(500, f"generation failed: {error}", code="engine_error")


def finish(text: str, tokens: Sequence[int], stops: Sequence[str], eos: Sequence[int]) -> tuple[str, str]:
    """(text cut before its first stop string, finish reason) of a whole generation: "stop"
    when a stop string or EOS ended it, "length" when it ran to max_tokens."""
    cut = [i for i in (text.find(s) for s in stops) if i >= 0]
    stopped = bool(cut) or (bool(tokens) and tokens[-1] in eos)
    return (text[: min(cut)] if cut else text), STOP if stopped else LENGTH


def meta(chat: bool, model_name: str) -> dict[str, Any]:
    """The id, created and model fields that every body and chunk of one response shares."""
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": model_name,
    }


def model_list(served: list[tuple[str, int]], created: int) -> dict[str, Any]:
    """GET /v1/models: every served name (models, then routes) with its max_model_len."""
    cards = [
        {"id": name, "object": "model", "created": created, "owned_by": "hybridrt", "max_model_len": length}
        for name, length in served
    ]
    return {"object": "list", "data": cards}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """prompt_tokens counts each prompt once, however many choices it has (as OpenAI)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def choice(
    index: int,
    chat: bool,
    text: str,
    finish_reason: str | None,
    delta: bool = False,
    logprobs: Any = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One entry of `choices`: a completion's text, a chat message, or (delta) a chunk's piece
    of either; `logprobs` in the shape of hybridrt.serve.logprobs.shape, or None; a chat
    message's `tool_calls` (its content is then null when empty; in a delta, the calls' deltas
    as hybridrt.serve.tool_parse makes them, each with its index)."""
    out: dict[str, Any] = {"index": index}
    if not chat:
        out["text"] = text
    elif delta:
        out["delta"] = {"content": text} if text else {}
        if tool_calls:
            out["delta"]["tool_calls"] = tool_calls
    else:
        out["message"] = {"role": "assistant", "content": text or (None if tool_calls else text)}
        if tool_calls:
            out["message"]["tool_calls"] = tool_calls
    out["logprobs"] = logprobs
    out["finish_reason"] = finish_reason
    return out


def completion(meta: dict[str, Any], chat: bool, choices: list[dict[str, Any]], usage: Any) -> dict[str, Any]:
    """A whole (non-streamed) response body."""
    kind = "chat.completion" if chat else "text_completion"
    return {**meta, "object": kind, "choices": choices, "usage": usage}


def chunk(meta: dict[str, Any], chat: bool, choices: list[dict[str, Any]], usage: Any = None) -> bytes:
    """One server-sent event of a streamed response; the usage chunk has no choices."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    body = {**meta, "object": kind, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def role_chunk(meta: dict[str, Any], indices: Iterable[int]) -> bytes:
    """A chat stream's first chunk: it names the role of every choice, as OpenAI's does."""
    role = {"role": "assistant", "content": ""}
    return chunk(meta, True, [{"index": i, "delta": role, "logprobs": None, "finish_reason": None} for i in indices])


def error_event(e: ApiError) -> bytes:
    """A failure in the middle of a stream (the status line has gone out): its error body as an event."""
    return b"data: " + json.dumps(e.body()).encode() + b"\n\n"


def delta_chunks(
    meta: dict[str, Any], index: int, events: Sequence[str | dict[str, Any]], reason: str | None, logprobs: Any
) -> list[bytes]:
    """A chat choice's events (content text and tool-call deltas, hybridrt.serve.tool_parse) as
    chunks: content in one chunk, each call's first delta (its name, arguments "") in its own
    (as OpenAI's), then its argument fragments (consecutive ones joined); the logprobs on the
    first chunk, the finish reason on the last (an empty delta when there is nothing else)."""
    content = "".join(e for e in events if isinstance(e, str))
    deltas: list[dict[str, Any]] = []
    for e in (e for e in events if not isinstance(e, str)):
        last = deltas[-1] if deltas else {}
        if "id" in e or "id" in last or last.get("index") != e["index"]:
            deltas.append({"index": e["index"], **{k: v for k, v in e.items() if k != "index"}})
        else:  # a call's consecutive fragments: one delta
            arguments = last["function"]["arguments"] + e["function"]["arguments"]
            last["function"] = {"arguments": arguments}
    pieces: list[tuple[str, list[dict[str, Any]] | None]] = [(content, None)] if content or not deltas else []
    pieces += [("", [d]) for d in deltas]
    return [
        chunk(
            meta,
            True,
            [
                choice(
                    index,
                    True,
                    text,
                    reason if k == len(pieces) - 1 else None,
                    delta=True,
                    logprobs=logprobs if k == 0 else None,
                    tool_calls=calls,
                )
            ],
        )
        for k, (text, calls) in enumerate(pieces)
    ]


def event_stream(
    meta: dict[str, Any], chat: bool, choices: Sequence[tuple[str, str, Any, list[Any] | None]], usage: Any
) -> bytes:
    """The whole stream of finished choices ((text, finish reason, logprobs, tool-call events
    or None) each): the role chunk for chat, one chunk per choice with all its text (with tool
    calls, delta_chunks of its events), the usage chunk unless usage is None, DONE."""
    parts = [role_chunk(meta, range(len(choices)))] if chat else []
    for i, (text, reason, lp, events) in enumerate(choices):
        if chat and events is not None:
            parts += delta_chunks(meta, i, events, reason, lp)
        else:
            parts.append(chunk(meta, chat, [choice(i, chat, text, reason, delta=True, logprobs=lp)]))
    if usage is not None:
        parts.append(chunk(meta, chat, [], usage))
    parts.append(DONE)
    return b"".join(parts)
