"""Prompts in, text out: the tokenizer, prompt normalization and streaming detokenization."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GenerationError, GraphError

TOKENIZER = "tokenizer.json"
REPLACEMENT = "\ufffd"  # what a decoder emits for an incomplete UTF-8 sequence


def load_tokenizer(directory: Path) -> Any | None:
    """The directory's tokenizer.json as a `tokenizers.Tokenizer`, or None if it has none."""
    path = directory / TOKENIZER
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise GraphError(f"{path} cannot be read as a tokenizer ({e}); re-export the model") from None


@dataclass(frozen=True)
class Prompts:
    """Prompts as token lists, with how they came in: text or ids, one or a batch."""

    rows: list[list[int]]
    text: bool
    single: bool


def as_prompts(prompt: Any, tokenizer: Any | None, vocab: int, add_special_tokens: bool = True) -> Prompts:
    """One text, a list of texts, one token-id list, or a list of token-id lists."""
    if isinstance(prompt, str):
        return Prompts(encode([prompt], tokenizer, add_special_tokens), text=True, single=True)
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    if not isinstance(prompt, Sequence) or len(prompt) == 0:
        raise GenerationError(f"empty or unreadable prompt {prompt!r}: give text, token ids, or a list of either")
    if all(isinstance(p, str) for p in prompt):
        return Prompts(encode(list(prompt), tokenizer, add_special_tokens), text=True, single=False)
    if all(_is_id(t) for t in prompt):
        return Prompts([_ids(prompt, vocab)], text=False, single=True)
    if all(isinstance(p, Sequence | np.ndarray) and not isinstance(p, str) for p in prompt):
        return Prompts([_ids(p, vocab) for p in prompt], text=False, single=False)
    raise GenerationError("a prompt must be text, token ids, or a list of one kind of these, not a mix")


def _is_id(t: object) -> bool:
    return isinstance(t, int | np.integer) and not isinstance(t, bool)


def _ids(p: Sequence[int], vocab: int) -> list[int]:
    if len(p) == 0:
        raise GenerationError("empty prompt: a prompt needs at least one token")
    ids = [int(t) for t in p] if all(_is_id(t) for t in p) else []
    if not ids or min(ids) < 0 or max(ids) >= vocab:
        raise GenerationError(f"token ids must be integers in [0, {vocab}); got {list(p)[:8]}...")
    return ids


def encode(texts: list[str], tokenizer: Any | None, add_special_tokens: bool = True) -> list[list[int]]:
    from .input_checks import check_text

    check_text(texts)
    rows = [e.ids for e in need_tokenizer(tokenizer).encode_batch(texts, add_special_tokens=add_special_tokens)]
    if any(not r for r in rows):
        raise GenerationError("empty prompt: the text encodes to no tokens")
    return rows


def need_tokenizer(tokenizer: Any | None) -> Any:
    """The tokenizer, or a GenerationError that says how to get one."""
    if tokenizer is None:
        raise GenerationError(
            f"text needs a tokenizer, and the model directory has no {TOKENIZER}: copy the checkpoint's "
            f"{TOKENIZER} into it (or re-export), or pass token ids instead of text"
        )
    return tokenizer


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def stop_check(tokenizer: Any | None, stops: Sequence[str]) -> Callable[[Sequence[int]], bool] | None:
    """Whether a sequence's new tokens end in one of the stop strings (None: no stop strings).
    Only a tail is decoded: a token holds at least one byte and a character at most four, so
    it covers any stop string that the newest token completes."""
    if not stops:
        return None
    need_tokenizer(tokenizer)
    longest = max(len(s) for s in stops)

    def stop(tokens: Sequence[int]) -> bool:
        tail = decode(tokenizer, tokens[-4 * longest - 4 :])
        return any(s in tail for s in stops)

    return stop


class StreamDecoder:
    """Text pieces from a growing token list; a character split across tokens comes out whole.

    Each call decodes all ids so far and emits the text beyond what was emitted, holding back
    a trailing U+FFFD (an incomplete UTF-8 sequence that the next token may complete).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = decode(self.tokenizer, self.ids)
        end = len(text.rstrip(REPLACEMENT))
        return self._emit(text, end)

    def flush(self) -> str:
        """Whatever is held back, once no more tokens will come."""
        text = decode(self.tokenizer, self.ids)
        return self._emit(text, len(text))

    def _emit(self, text: str, end: int) -> str:
        piece = text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return piece
