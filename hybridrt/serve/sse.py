"""A job's response in OpenAI's shapes (openai.py): whole, or streamed as server-sent events
ending with `data: [DONE]`. With tools, a choice's tool calls are parsed from its text
(hybridrt.serve.tool_parse) and its finish_reason is "tool_calls" when it made any; a stream
sends the text before a call as content and each call as OpenAI does: a first delta with its
id and name, then its arguments in fragments as the tokens arrive."""

from __future__ import annotations

from typing import Any

import anyio
from starlette.responses import Response

from . import openai
from .jobs import Job
from .tool_parse import CallParser
from .tools import parse_calls


def full_body(job: Job, meta: dict[str, Any], chat: bool) -> dict[str, Any]:
    choices = []
    for c in job.choices:
        text, reason, calls = "".join(c.text), c.finish_reason, None
        if job.tools is not None:
            text, calls = parse_calls(text, job.tools)
            reason = _called(reason) if calls else reason
        choices.append(openai.choice(c.index, chat, text, reason, logprobs=job.logprobs(chat, c), tool_calls=calls))
    return openai.completion(meta, chat, choices, job.usage())


def _called(reason: str | None) -> str | None:
    return openai.TOOL_CALLS if reason == openai.STOP else reason


class EventStream(Response):
    """Streams a job's pieces as SSE; a client that goes away cancels the job at once, which
    frees its state slots in the engine before the next step."""

    def __init__(
        self, job: Job, meta: dict[str, Any], chat: bool, include_usage: bool, continuous_usage: bool = False
    ) -> None:
        # No Content-Length (Response.__init__ would declare 0): the body is as long as the stream.
        self.status_code, self.background = 200, None
        self.raw_headers = [(k.encode(), v.encode()) for k, v in openai.EVENT_STREAM_HEADERS.items()]
        self.job, self.meta, self.chat, self.include_usage = job, meta, chat, include_usage
        self.continuous_usage = continuous_usage

    async def events(self) -> Any:
        if self.chat:
            yield openai.role_chunk(self.meta, (c.index for c in self.job.choices))
        tools = self.job.tools
        parsers = {c.index: CallParser(tools.names) for c in self.job.choices} if tools is not None else {}
        async for c, piece, part in self.job.pieces():
            if c.finish_reason in openai.FAILURES:
                yield openai.error_event(openai.failure(c.finish_reason, c.error))
                continue
            logprobs = None if part is None else self.job.logprobs(self.chat, c, part)
            reason = c.finish_reason
            parser = parsers.get(c.index)
            if parser is None:
                choice = openai.choice(c.index, self.chat, piece, reason, delta=True, logprobs=logprobs)
                yield openai.chunk(self.meta, self.chat, [choice], self.job.usage() if self.continuous_usage else None)
                continue
            events = parser.push(piece)
            if reason is not None:
                events += parser.finish()
                reason = _called(reason) if parser.calls else reason
            elif not events and logprobs is None:
                continue  # held back: it may be the start of a call
            for event in openai.delta_chunks(self.meta, c.index, events, reason, logprobs):
                yield event
        if self.include_usage:
            yield openai.chunk(self.meta, self.chat, [], self.job.usage())
        yield openai.DONE

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
