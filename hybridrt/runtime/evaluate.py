"""Perplexity and bits per byte of a text under an exported model (torch-free).

Sliding windows (the transformers perplexity recipe): each window of `window` tokens starts
from fresh states and advances by `stride`; only the tokens no earlier window scored count,
so each token is scored once with at least `window - stride` tokens of context (fewer at the
start). The first token has no context and is not scored; bits per byte divide the summed
NLL by the UTF-8 bytes of the scored tokens, which makes models with different tokenizers
comparable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import GenerationError


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis, shifted by the maximum so that exp never overflows."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def window_starts(n_tokens: int, window: int, stride: int) -> list[int]:
    """Window starts, at most window - 1 apart: a window's first token has no logits predicting
    it, so consecutive windows share at least one token and every token after the first is scored."""
    if n_tokens <= window:
        return [0]
    step = min(stride, window - 1)
    return list(range(0, n_tokens - window + step, step))


def scored_windows(n_tokens: int, window: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """(start, length, first) per window: the window ids[start : start + length] scores the
    tokens [first, start + length), which no earlier window scored (token 0 never is)."""
    scored_to = 1
    for start in window_starts(n_tokens, window, stride):
        length = min(window, n_tokens - start)
        yield start, length, max(scored_to, start + 1)
        scored_to = start + length


LogitsFn = Callable[[np.ndarray], np.ndarray]


def ort_logits_fn(model: Any) -> LogitsFn:
    """ids [1, l] -> logits [l, V] from fresh states (a runtime Model's state batch)."""

    def run(chunk: np.ndarray) -> np.ndarray:
        return model.stepper(1, chunk.shape[1]).forward(chunk, all_logits=True)[0]

    return run


def token_nll(
    logits_fn: LogitsFn, ids: Sequence[int], window: int, stride: int, progress: Callable[[int], None]
) -> np.ndarray:
    """NLL (nats) of ids[1:], each predicted from its preceding context within a window."""
    ids_arr = np.asarray(ids, dtype=np.int64)
    nll = np.full(len(ids_arr), np.nan)
    for start, length, first in scored_windows(len(ids_arr), window, stride):
        logits = logits_fn(ids_arr[start : start + length][None, :])  # [l, V]
        targets = ids_arr[first : start + length]
        if len(targets):
            lp = log_softmax(logits[first - start - 1 : length - 1].astype(np.float64))
            nll[first : first + len(targets)] = -lp[np.arange(len(targets)), targets]
            progress(len(targets))
    return nll[1:]


def score_text(
    logits_fn: LogitsFn,
    tokenizer: Any,
    text: str,
    window: int,
    stride: int,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """nll_per_token, perplexity, bits_per_byte, tokens and bytes of `text`."""
    if not text.strip():
        raise GenerationError("the text to evaluate is empty")
    if not 0 < stride <= window:
        raise GenerationError(f"need 0 < stride ({stride}) <= window ({window})")
    enc = tokenizer.encode(text, add_special_tokens=False)
    ids, offsets = list(enc.ids), list(enc.offsets)
    if len(ids) < 2:
        raise GenerationError("the text is shorter than two tokens; nothing to score")
    nll = token_nll(logits_fn, ids, window, stride, progress or (lambda n: None))
    n_bytes = len(text[offsets[1][0] :].encode("utf-8"))  # the unscored first token's bytes excluded
    total = float(nll.sum())
    return {
        "nll_per_token": total / len(nll),
        "perplexity": math.exp(total / len(nll)),
        "bits_per_byte": total / math.log(2) / n_bytes,
        "tokens": len(nll),
        "bytes": n_bytes,
        "window": window,
        "stride": stride,
    }


def eval_settings(model: Any, window: int | None, stride: int | None) -> tuple[int, int]:
    """The window and stride evaluate() will use, checked before any work is done."""
    if model.tokenizer is None:
        raise GenerationError(f"{model.path} has no tokenizer.json; evaluation of text needs one")
    window = min(model.max_length, 1024) if window is None else window
    if not 2 <= window <= model.max_length:
        raise GenerationError(f"window must be in [2, {model.max_length}] (the model's max length), got {window}")
    stride = window // 2 if stride is None else stride
    if not 0 < stride <= window:
        raise GenerationError(f"stride must be in [1, window = {window}], got {stride}")
    return window, stride


def evaluate(
    model: Any,
    text: str,
    window: int | None = None,
    stride: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """score_text with the runtime model's ONNX session and tokenizer."""
    window, stride = eval_settings(model, window, stride)
    return score_text(ort_logits_fn(model), model.tokenizer, text, window, stride, progress)


def bench_rows(manifests: Sequence[Any], batch: int, prompt_tokens: int, seed: int = 0) -> list[list[int]]:
    """`hybridrt bench`'s prompts: random ids above every special token of the models (no EOS or
    BOS inside a prompt), within the smallest vocabulary."""
    vocab = min(m.vocab_size for m in manifests)
    specials = {
        t
        for m in manifests
        for v in m.special_tokens.values()
        for t in (v if isinstance(v, list) else [v])
        if isinstance(t, int)
    }
    low = max([*specials, 2]) + 1
    return np.random.default_rng(seed).integers(low, vocab, (batch, prompt_tokens)).tolist()  # type: ignore[no-any-return]
