"""One HTTP request's work on the engine: its choices (prompts x n), their text as it streams.

The engine thread hands updates over with `loop.call_soon_threadsafe`; the event loop turns
tokens into text, cut at stop strings the way OpenAI does (the stop string is not returned).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..runtime.text import StreamDecoder
from .engine import Engine, Request, Update
from .protocol import Params


class TextStream:
    """Text of one choice as its tokens arrive, cut before the first stop string; holds back
    the last len(longest stop) - 1 characters, which a later token may turn into a stop."""

    def __init__(self, tokenizer: Any, stops: tuple[str, ...]) -> None:
        self.decoder = StreamDecoder(tokenizer)
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, tokens: list[int]) -> str:
        for t in tokens:
            self.text += self.decoder.push(t)
        return self._emit(final=False)

    def finish(self) -> str:
        self.text += self.decoder.flush()
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self.stopped:
            return ""
        # A stop starting before `sent` would lie wholly in text already searched.
        hits = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, end = True, min(hits)
        else:
            end = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        piece = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return piece


@dataclass(eq=False)
class Choice:
    index: int
    request: Request
    stream: TextStream
    tokens: int = 0
    cached: int = 0
    finish_reason: str | None = None
    error: str | None = None
    text: list[str] = field(default_factory=list)


class Job:
    def __init__(self, engine: Engine, params: Params, tokenizer: Any, timeout: float | None) -> None:
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, Update]] = asyncio.Queue()
        self.choices: list[Choice] = []
        self.n = params.n
        for row in params.rows:
            for j in range(params.n):
                cfg = params.cfg
                if cfg.seed is not None and j:
                    cfg = dataclasses.replace(cfg, seed=(cfg.seed + j) % 2**63)
                i = len(self.choices)
                req = Request(row, cfg, self._emitter(i), params.presence_penalty, params.frequency_penalty, timeout)
                self.choices.append(Choice(i, req, TextStream(tokenizer, cfg.stops)))

    def _emitter(self, i: int) -> Any:
        def emit(update: Update) -> None:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (i, update))

        return emit

    def submit(self) -> None:
        """Queue every choice; if one is refused, withdraw the others and raise."""
        done = []
        try:
            for c in self.choices:
                self.engine.submit(c.request)
                done.append(c)
        except Exception:
            for c in done:
                self.engine.cancel(c.request)
            raise

    def cancel(self) -> None:
        for c in self.choices:
            if c.finish_reason is None:
                self.engine.cancel(c.request)

    async def pieces(self) -> AsyncIterator[tuple[Choice, str]]:
        """(choice, new text) as tokens arrive; a choice's last piece comes with its finish_reason set."""
        live = len(self.choices)
        while live:
            i, update = await self.queue.get()
            c = self.choices[i]
            c.tokens += len(update.tokens)
            c.cached = update.cached_tokens
            piece = c.stream.push(update.tokens)
            if update.finish_reason is not None:
                piece += c.stream.finish()
                c.finish_reason, c.error = update.finish_reason, update.error
                live -= 1
            c.text.append(piece)
            if piece or update.finish_reason is not None:
                yield c, piece

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(c.request.prompt) for c in self.choices[:: self.n])  # each prompt once, as OpenAI
        completion = sum(c.tokens for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(c.cached for c in self.choices)},
        }
