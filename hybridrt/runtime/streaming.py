"""Streams of text pieces, and the time limit of a generation (timeout=)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import GenerationError, GenerationTimeout
from . import decode as dec
from .text import StreamDecoder

Output = str | list[str] | list[int] | list[list[int]] | list[list[str]] | list[list[list[int]]]


class TextStream(Iterator[str]):
    """Text pieces of a continuation as they are generated; `stats` fills in as it runs and
    is complete once the stream is exhausted (or closed)."""

    def __init__(self, pieces: Iterator[str], stats: dec.GenerationStats) -> None:
        self._pieces = pieces
        self.stats = stats

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        """Stop generating; a chat session keeps the states of the tokens so far."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


def text_pieces(tokenizer: Any, steps: Iterator[np.ndarray], stats: dec.GenerationStats) -> Iterator[str]:
    """The text of row 0's new tokens as `steps` generate them (a piece once it decodes whole)."""
    stream = StreamDecoder(tokenizer)
    done = 0
    for _ in steps:
        for token in stats.tokens[0][done:]:
            piece = stream.push(token)
            if piece:
                yield piece
        done = len(stats.tokens[0])
    tail = stream.flush()
    if tail:
        yield tail


def deadline_after(timeout: float | None) -> float | None:
    """The monotonic time a call with `timeout` seconds must stop by (None: no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise GenerationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    return time.monotonic() + float(timeout)


def until(steps: Iterator[Any], deadline: float | None, stats: dec.GenerationStats) -> Iterator[Any]:
    """`steps` until `deadline`: after the step that passes it, the steps are closed (their
    loop's cleanup runs: a session's states stay consistent) and GenerationTimeout is raised."""
    if deadline is None:
        yield from steps
        return
    close = getattr(steps, "close", lambda: None)  # a generator's: its loop's cleanup runs now
    try:
        for item in steps:
            yield item
            if time.monotonic() > deadline:
                close()
                n = sum(len(t) for t in stats.tokens)
                raise GenerationTimeout(f"generation passed its timeout after {n} new tokens", stats)
    finally:
        close()
