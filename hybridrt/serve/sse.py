"""Response bodies in OpenAI's shapes, whole or as server-sent events ending with `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.responses import Response

from .jobs import Choice, Job
from .protocol import FAILURES, failure

DONE = b"data: [DONE]\n\n"


def _choice(c: Choice, chat: bool, text: str, delta: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"index": c.index}
    if not chat:
        out["text"] = text
    elif delta:
        out["delta"] = {"content": text} if text else {}
    else:
        out["message"] = {"role": "assistant", "content": text}
    out["logprobs"] = None
    out["finish_reason"] = c.finish_reason
    return out


def full_body(job: Job, meta: dict[str, Any], chat: bool) -> dict[str, Any]:
    choices = [_choice(c, chat, "".join(c.text), delta=False) for c in job.choices]
    kind = "chat.completion" if chat else "text_completion"
    return {**meta, "object": kind, "choices": choices, "usage": job.usage()}


def chunk_body(meta: dict[str, Any], chat: bool, choices: list[dict[str, Any]], usage: Any = None) -> bytes:
    kind = "chat.completion.chunk" if chat else "text_completion"
    body = {**meta, "object": kind, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


class EventStream(Response):
    """Streams a job's pieces as SSE; a client that goes away cancels the job at once, which
    frees its state slots in the engine before the next step."""

    def __init__(self, job: Job, meta: dict[str, Any], chat: bool, include_usage: bool) -> None:
        # No Content-Length (Response.__init__ would declare 0): the body is as long as the stream.
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        self.job, self.meta, self.chat, self.include_usage = job, meta, chat, include_usage

    async def events(self) -> Any:
        if self.chat:  # the first chunk names the role, as OpenAI's does
            role = [
                {
                    "index": c.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for c in self.job.choices
            ]
            yield chunk_body(self.meta, True, role)
        async for c, piece in self.job.pieces():
            if c.finish_reason in FAILURES:
                yield b"data: " + json.dumps(failure(c.finish_reason, c.error).body()).encode() + b"\n\n"
                continue
            yield chunk_body(self.meta, self.chat, [_choice(c, self.chat, piece, delta=True)])
        if self.include_usage:
            yield chunk_body(self.meta, self.chat, [], self.job.usage())
        yield DONE

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})

        async def watch(scope_: anyio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.job.cancel()
            scope_.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, tg.cancel_scope)
                async for event in self.events():
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        except OSError:  # the client went away while we wrote
            pass
        finally:
            self.job.cancel()
