"""Generation parameters and next-token sampling, in numpy.

Names follow transformers' GenerationConfig; so does the order of the logit transforms
(repetition penalty and min-new-tokens EOS suppression, then temperature, top-k, top-p).

Shapes: b = batch rows, V = vocabulary size. `logits` [b, V] float32 (last position),
`seen` [b, V] bool (tokens already in each row, for the repetition penalty).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..errors import GenerationError


@dataclass(frozen=True)
class GenerationConfig:
    """One generation's parameters; the single source of defaults (the CLI reads them too).

    `do_sample=None` samples when any of temperature/top_k/top_p is given, except that
    `temperature=0` means greedy. `eos_token_id=None` takes the model's EOS ids from its
    manifest; `eos_token_id=[]` never stops early.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None
    eos_token_id: int | Sequence[int] | None = None
    stop_strings: str | Sequence[str] | None = None

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> GenerationConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise GenerationError(
                f"unknown generation parameter {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @property
    def sampling(self) -> bool:
        if self.do_sample is not None:
            return self.do_sample
        if self.temperature == 0:
            return False
        return any(v is not None for v in (self.temperature, self.top_k, self.top_p))

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop_strings is None:
            return ()
        return (self.stop_strings,) if isinstance(self.stop_strings, str) else tuple(self.stop_strings)

    def eos_ids(self, default: Sequence[int]) -> tuple[int, ...]:
        eos = default if self.eos_token_id is None else self.eos_token_id
        return (int(eos),) if isinstance(eos, int | np.integer) else tuple(int(e) for e in eos)

    def validate(self) -> None:
        """Raise GenerationError on any value that cannot work, before any work is done."""
        errors = []
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            errors.append(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not _is_int(self.min_new_tokens) or self.min_new_tokens < 0:
            errors.append(f"min_new_tokens must be an integer >= 0, got {self.min_new_tokens!r}")
        if self.temperature is not None and (self.temperature < 0 or (self.temperature == 0 and self.sampling)):
            errors.append(
                f"temperature must be > 0 when sampling, got {self.temperature!r} (use do_sample=False for greedy)"
            )
        if self.top_p is not None and not 0 < self.top_p <= 1:
            errors.append(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 0):
            errors.append(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not self.repetition_penalty > 0:
            errors.append(f"repetition_penalty must be > 0 (1.0 = off), got {self.repetition_penalty!r}")
        if self.seed is not None and not _is_int(self.seed):
            errors.append(f"seed must be an integer, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stops):
            errors.append(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        if self.eos_token_id is not None:
            eos: Any = [self.eos_token_id] if _is_int(self.eos_token_id) else self.eos_token_id
            if isinstance(eos, str) or not all(_is_int(e) and e >= 0 for e in eos):
                errors.append(f"eos_token_id must be a token id or a list of them, got {self.eos_token_id!r}")
        if errors:
            raise GenerationError("; ".join(errors))


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> None:
    """In place, as transformers: seen tokens' positive logits / penalty, negative * penalty."""
    picked = logits[seen]
    logits[seen] = np.where(picked < 0, picked * penalty, picked / penalty)


def top_k_filter(logits: np.ndarray, k: int) -> None:
    """In place: everything below each row's k-th largest logit -> -inf."""
    if 0 < k < logits.shape[-1]:
        kth = np.partition(logits, -k, axis=-1)[:, -k, None]
        logits[logits < kth] = -np.inf


def top_p_filter(probs: np.ndarray, p: float) -> None:
    """In place: keep the most likely tokens whose mass before them is below p (at least one)."""
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    drop_sorted = np.cumsum(sorted_probs, axis=-1) - sorted_probs >= p
    drop = np.empty_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    probs[drop] = 0.0
    probs /= probs.sum(axis=-1, keepdims=True)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sample(
    logits: np.ndarray,
    cfg: GenerationConfig,
    rng: np.random.Generator,
    seen: np.ndarray | None = None,
    suppress: Sequence[int] = (),
) -> np.ndarray:
    """Next token per row: logits [b, V] -> int64 [b]. Never modifies `logits`."""
    if seen is not None or suppress or cfg.sampling:
        logits = logits.astype(np.float32, copy=True)
    if seen is not None and cfg.repetition_penalty != 1.0:
        apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if suppress:
        logits[:, list(suppress)] = -np.inf
    if not cfg.sampling:
        return logits.argmax(axis=-1).astype(np.int64, copy=False)
    if cfg.temperature is not None and cfg.temperature != 1.0:
        logits /= cfg.temperature
    if cfg.top_k:
        top_k_filter(logits, cfg.top_k)
    probs = softmax(logits.astype(np.float64))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        top_p_filter(probs, cfg.top_p)
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random((probs.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=-1), probs.shape[-1] - 1).astype(np.int64)
