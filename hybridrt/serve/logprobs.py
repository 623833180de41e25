"""Token log-probabilities (`logprobs`, `top_logprobs`, `echo`) and OpenAI's shapes for them.

What a logprob is: the log-softmax of the model's raw logits at the position that predicts
the token, in float64 from the float32 logits; before the repetition, presence and frequency
penalties, temperature, top-k and top-p (vLLM's default, its "raw_logprobs" mode). So a token
has the same logprob however it was chosen, the top alternatives are the model's own, and a
prompt's logprobs are the negatives of what `hybridrt eval` sums
(hybridrt.runtime.evaluate.token_nll). A logprob below -9999 is sent as -9999.0, as OpenAI
does (JSON has no -Infinity).

Shapes: n = tokens scored, V = vocabulary, k = alternatives asked for.

Token text: a token's bytes (for byte-level BPE tokenizers its exact bytes, otherwise the
UTF-8 of its decoded text); its text is those bytes as UTF-8, or `bytes:\\xe2\\x80` where they
are not whole characters, as OpenAI writes them. A completion's `text_offset` counts the
characters of the token texts before each token (vLLM's convention), from the start of the
echoed prompt for prompt tokens and from the end of it for generated ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime.decode import PREFILL_CHUNK
from ..runtime.evaluate import log_softmax
from ..runtime.state import Stepper

FLOOR = -9999.0
MAX_COMPLETION_LOGPROBS = 5  # /v1/completions `logprobs`, as OpenAI
MAX_TOP_LOGPROBS = 20  # /v1/chat/completions `top_logprobs`, as OpenAI


@dataclass(frozen=True)
class TokenLogprob:
    """One token's logprob (None for a prompt's first token, which nothing predicts) and the
    k most likely tokens at its position, most likely first."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


def score(logits: np.ndarray, targets: Sequence[int], k: int) -> list[TokenLogprob]:
    """logits [n, V] (raw; row i predicts targets[i]) -> each target's logprob and the top k."""
    n = len(targets)
    if not n:
        return []
    lp = log_softmax(np.asarray(logits[:n], dtype=np.float64))
    rows = np.arange(n)
    chosen = lp[rows, np.asarray(targets, dtype=np.int64)]
    best: list[tuple[tuple[int, float], ...]] = [()] * n
    if k:
        k = min(k, lp.shape[-1])
        top = np.argpartition(-lp, k - 1, axis=-1)[:, :k]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(lp, top, -1), axis=-1, kind="stable"), -1)
        best = [tuple((int(t), _floor(lp[i, t])) for t in top[i]) for i in range(n)]
    return [TokenLogprob(int(t), _floor(c), b) for t, c, b in zip(targets, chosen, best)]


def prompt_scores(logits: np.ndarray, prompt: Sequence[int], start: int, k: int) -> list[TokenLogprob]:
    """Entries of the prompt tokens that logits [s, V] of positions start .. start + s - 1
    predict (a prompt's last position predicts the first new token: not scored here); the
    first token's entry, with no logprob, when start is 0."""
    head = [TokenLogprob(prompt[0], None)] if start == 0 else []
    return head + score(logits, prompt[start + 1 : start + 1 + logits.shape[0]], k)


def _floor(x: Any) -> float:
    return max(float(x), FLOOR)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, printable character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = list(bs)
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenText:
    """Token id -> (text, bytes) as logprobs show tokens (see the module docstring); cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(tokenizer, "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        self.alphabet = _byte_decoder() if self.byte_level else {}
        self.known: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        got = self.known.get(token)
        if got is None:
            raw = self._bytes(token)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            got = self.known[token] = (text, list(raw))
        return got

    def _bytes(self, token: int) -> bytes:
        if self.tokenizer is None:
            return str(token).encode()
        piece = self.tokenizer.id_to_token(token) if self.byte_level else None
        if piece is not None and all(c in self.alphabet for c in piece):
            return bytes(self.alphabet[c] for c in piece)
        return str(self.tokenizer.decode([token], skip_special_tokens=False)).encode("utf-8")


def completion_logprobs(names: TokenText, entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """/v1/completions `logprobs` of these tokens: {tokens, token_logprobs, top_logprobs,
    text_offset}; each top_logprobs entry maps token text -> logprob for the top k and the
    token itself (so up to k + 1 of them, as OpenAI), None for a prompt's first token."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        text = names(e.token)[0]
        out["tokens"].append(text)
        out["token_logprobs"].append(e.logprob)
        if e.logprob is None:
            out["top_logprobs"].append(None)
        else:
            top = {names(t)[0]: lp for t, lp in e.top}
            top.setdefault(text, e.logprob)
            out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def chat_shape(names: TokenText, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """/v1/chat/completions `logprobs` of these tokens: {content: [{token, logprob, bytes,
    top_logprobs: [{token, logprob, bytes}]}], refusal: None}."""
    content = []
    for e in entries:
        text, raw = names(e.token)
        top = [{"token": names(t)[0], "logprob": lp, "bytes": names(t)[1]} for t, lp in e.top]
        content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content, "refusal": None}


def text_length(entries: Sequence[TokenLogprob], names: TokenText) -> int:
    """Characters of these tokens' texts: where text_offset goes on after them."""
    return sum(len(names(e.token)[0]) for e in entries)


def shape(
    names: TokenText, chat: bool, prompt: Sequence[TokenLogprob], new: Sequence[TokenLogprob], offset: int
) -> dict[str, Any]:
    """OpenAI's `logprobs` of a choice (or of a chunk's part of it): the prompt's entries (echo)
    then the new tokens'; `offset` is the first new token's text_offset (after the echo)."""
    if chat:
        return chat_shape(names, [*prompt, *new])
    head, tail = completion_logprobs(names, prompt, 0), completion_logprobs(names, new, offset)
    return {k: head[k] + tail[k] for k in head}


def rescore(stepper: Stepper, ids: Sequence[int], k: int) -> list[TokenLogprob]:
    """Entries of every token of `ids` (the first has no logprob), from one pass over them
    with the logits of all positions, from the stepper's (fresh) states."""
    entries = []
    for start in range(0, len(ids), PREFILL_CHUNK):
        chunk = np.asarray([ids[start : start + PREFILL_CHUNK]], dtype=np.int64)
        entries += prompt_scores(stepper.forward(chunk, all_logits=True)[0], ids, start, k)
    return entries
