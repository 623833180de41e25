"""Streams of text pieces (the time limit of a generation, timeout=, is decode.until's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

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
