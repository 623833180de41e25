"""One HTTP request's work on the engine: its choices (prompts x n), their text as it streams.

The engine thread hands updates over with `loop.call_soon_threadsafe`, so it never waits on a
client; the event loop turns tokens into text, cut at stop strings the way OpenAI does (the
stop string is not returned). Updates wait in the job's queue while its client's socket is
full; past `backlog` updates per choice, the job is cancelled (its slots freed) and ends with
finish_reason `slow_client`.
With echo, a choice's first piece starts with its prompt's text; with logprobs, each piece
comes with the logprob entries of the tokens its update brought (the prompt's first, for echo).
A constrained job (response_format, a forced tool call) gives each choice its own matcher of
the grammar, compiled here so that a grammar that does not compile is the client's 400. With
tools, the text keeps LFM2's tool-call markers (special tokens) for the call parser.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..runtime.text import StreamDecoder
from . import openai
from .engine import Engine, Request, Update
from .grammar import Matcher, matchers
from .logprobs import TokenLogprob, TokenText, shape, text_length
from .protocol import Params
from .tools import with_markers


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
    echo: str | None = None  # the prompt's text, sent before the first piece
    tokens: int = 0
    cached: int = 0
    finish_reason: str | None = None
    error: str | None = None
    text: list[str] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    offset: int = 0  # text_offset of the next new token


Part = tuple[list[TokenLogprob], list[TokenLogprob], int]  # prompt entries, new entries, offset of the new


class Job:
    def __init__(
        self, engine: Engine, params: Params, tokenizer: Any, timeout: float | None, backlog: int | None = None
    ) -> None:
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, Update]] = asyncio.Queue()
        self.backlog = None if backlog is None else backlog * params.n * len(params.rows)
        self.too_slow = False
        self.cancelled = False  # cancel() was called (the client left, or it read too slowly)
        self.choices: list[Choice] = []
        self.n = params.n
        self.names = TokenText(tokenizer) if params.logprobs is not None else None
        self.tools = params.tools
        text_of = tokenizer if params.tools is None else with_markers(tokenizer)  # LFM2's markers for the parser
        todo = params.choices()
        grammars: list[Matcher | None] = [None] * len(todo)
        if params.constraint is not None:
            assert engine.model is not None
            grammars = list(matchers(engine.model, params.constraint, len(todo)))
        for i, (row, cfg) in enumerate(todo):
            req = Request(
                row,
                cfg,
                self._emitter(i),
                timeout,
                logprobs=params.logprobs,
                prompt_logprobs=params.prompt_logprobs,
                score_only=params.score_only,
                grammar=grammars[i],
                taken=threading.Event(),
            )
            echo = None if params.echo is None else params.echo[i // params.n]
            self.choices.append(Choice(i, req, TextStream(text_of, cfg.stops), echo, offset=len(echo or "")))

    def _emitter(self, i: int) -> Any:
        def emit(update: Update) -> None:
            self.loop.call_soon_threadsafe(self._put, i, update)

        return emit

    def _put(self, i: int, update: Update) -> None:
        self.queue.put_nowait((i, update))
        taken = self.choices[i].request.taken
        if taken is not None and not taken.is_set():  # (the first update only: set takes a lock)
            taken.set()
        if self.backlog is not None and self.queue.qsize() > self.backlog and not self.too_slow:
            self.too_slow = True
            self.cancel()

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
        self.cancelled = True
        for c in self.choices:
            if c.finish_reason is None:
                self.engine.cancel(c.request)

    async def pieces(self) -> AsyncIterator[tuple[Choice, str, Part | None]]:
        """(choice, new text, its logprob entries when asked) as tokens arrive; a choice's last
        piece comes with its finish_reason set."""
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
                if self.too_slow and c.finish_reason == "cancelled":
                    c.finish_reason = "slow_client"
                live -= 1
            if c.echo is not None and not c.text:
                piece = c.echo + piece
            c.text.append(piece)
            part = self._part(c, update)
            if piece or part is not None or update.finish_reason is not None:
                yield c, piece, part

    def _part(self, c: Choice, update: Update) -> Part | None:
        """The update's logprob entries (None when none were asked or it brought none)."""
        if self.names is None or not (update.prompt_logprobs or update.logprobs):
            return None
        prompt, new = update.prompt_logprobs or [], update.logprobs or []
        c.prompt_logprobs += prompt
        c.logprobs += new
        part = (prompt, new, c.offset)
        c.offset += text_length(new, self.names)
        return part

    def logprobs(self, chat: bool, c: Choice, part: Part | None = None) -> dict[str, Any] | None:
        """OpenAI's `logprobs` of a chunk's part, or (no part) of the whole choice."""
        if self.names is None:
            return None
        if part is None:
            part = (c.prompt_logprobs, c.logprobs, len(c.echo or ""))
        return shape(self.names, chat, *part)

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(c.request.prompt) for c in self.choices[:: self.n])  # each prompt once
        completion = sum(c.tokens for c in self.choices)
        return openai.usage(prompt, completion, sum(c.cached for c in self.choices))
