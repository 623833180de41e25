"""Generation parameters and next-token sampling, in numpy.

Names follow transformers' GenerationConfig (and OpenAI's for presence_penalty and
frequency_penalty); so does the order of the logit transforms (OpenAI's penalties on the
generated tokens' counts, the repetition penalty and min-new-tokens EOS suppression, then
temperature, top-k, top-p). This is the one place a token is chosen: the decode loop, beam
search, speculative rounds, the server's requests and the Lambda handler all call it.

Shapes: b = batch rows, V = vocabulary size. `logits` [b, V] float32 (last position); a
`Tally` holds what the penalties read per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import GenerationError
from .input_checks import refuse_unknown


@dataclass(frozen=True)
class GenerationConfig:
    """One generation's parameters; the single source of defaults (the CLI reads them too).

    `do_sample=None` samples when any of temperature/top_k/top_p is given, except that
    `temperature=0` means greedy. `eos_token_id=None` takes the model's EOS ids from its
    manifest; `eos_token_id=[]` never stops early. `add_bos_token=True` prepends the
    tokenizer's BOS token to text prompts that lack it. A model's recommended values (its
    manifest's `generation`) replace these defaults; the caller's replace both.

    With an assistant (draft) model, `num_assistant_tokens` is how many tokens it drafts per
    round to begin with; the schedule then sets it: "adaptive" from the running acceptance
    rate and the measured cost of a draft step (hybridrt.runtime.speculative), "heuristic"
    as transformers (+2 after a round that kept every draft, -1 otherwise), "constant".

    `presence_penalty` and `frequency_penalty` are OpenAI's: each generated token's logit
    less presence_penalty once it has been generated and frequency_penalty times how often
    (the prompt does not count; `repetition_penalty` is transformers' over prompt and reply).

    `num_beams > 1` runs transformers' beam search (hybridrt.runtime.beam): `length_penalty`
    is the exponent of the generated length that finished scores are divided by,
    `early_stopping` (True, False or "never") when the search ends, and the best
    `num_return_sequences` (at most num_beams) come back per prompt.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    eos_token_id: int | Sequence[int] | None = None
    stop_strings: str | Sequence[str] | None = None
    add_bos_token: bool | None = None
    num_assistant_tokens: int = 5
    num_assistant_tokens_schedule: str = "adaptive"
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> GenerationConfig:
        refuse_unknown(cls, kwargs, GenerationError, "generation parameter")
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

    @property
    def penalized(self) -> bool:
        """Whether the repetition penalty applies (the tokens seen must be tracked)."""
        return self.repetition_penalty != 1.0

    @property
    def counted(self) -> bool:
        """Whether presence or frequency penalties apply (generated tokens must be counted)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def suppressed(self, eos: Sequence[int], index: int) -> tuple[int, ...]:
        """The tokens barred from new token number `index` (0-based): the EOS ids before
        min_new_tokens, none after."""
        return tuple(eos) if index < self.min_new_tokens else ()

    def eos_ids(self, default: Sequence[int]) -> tuple[int, ...]:
        eos = default if self.eos_token_id is None else self.eos_token_id
        return (int(eos),) if isinstance(eos, int | np.integer) else tuple(int(e) for e in eos)

    def validate(self) -> None:
        """Raise GenerationError on any value that cannot work, before any work is done
        (types and ranges: hybridrt.runtime.input_checks)."""
        from .input_checks import check_config

        check_config(self)


@dataclass
class Tally:
    """What the penalties read, per row: `seen` [b, V] bool, the tokens of the history and of
    the reply (repetition_penalty); `counts` [b, V] float32, how often each token was
    generated (presence_penalty, frequency_penalty). Each is None where cfg does not read it."""

    seen: np.ndarray | None = None
    counts: np.ndarray | None = None

    @classmethod
    def start(cls, cfg: GenerationConfig, history: Sequence[Sequence[int]], vocab: int) -> Tally:
        """The tally of rows whose history (prompt, earlier turns) is `history`."""
        seen = None
        if cfg.penalized:
            seen = np.zeros((len(history), vocab), dtype=bool)
            for r, ids in enumerate(history):
                seen[r, np.asarray(ids, dtype=np.int64)] = True
        counts = np.zeros((len(history), vocab), dtype=np.float32) if cfg.counted else None
        return cls(seen, counts)

    @property
    def empty(self) -> bool:
        """Nothing to count: no penalty reads the tokens."""
        return self.seen is None and self.counts is None

    def add(self, tokens: np.ndarray | Sequence[int], rows: np.ndarray | None = None) -> None:
        """Count each row's new token (tokens [b], or one per entry of `rows`); nothing to do
        (and nothing allocated) when no penalty reads the tally."""
        if self.empty:
            return
        tokens = np.asarray(tokens)
        where = np.arange(len(tokens)) if rows is None else rows
        if self.seen is not None:
            self.seen[where, tokens] = True
        if self.counts is not None:
            np.add.at(self.counts, (where, tokens), 1.0)

    def copy(self) -> Tally:
        return Tally(
            None if self.seen is None else self.seen.copy(), None if self.counts is None else self.counts.copy()
        )


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> None:
    """In place, as transformers: seen tokens' positive logits / penalty, negative * penalty."""
    picked = logits[seen].astype(np.float64)  # float32 would round a tiny penalty to 0: -inf * 0 is NaN
    with np.errstate(over="ignore", under="ignore", divide="ignore"):  # a tiny penalty: +inf, see softmax
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
    """Over the last axis. A row whose largest logit is +inf (a tiny repetition penalty or
    temperature can overflow float32) gets its limit: equal mass on its +inf entries."""
    top = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - top)
    infinite = np.isposinf(top[..., 0])
    if infinite.any():
        e[infinite] = np.isposinf(x[infinite])
    return e / e.sum(axis=-1, keepdims=True)


def processed_logits(
    logits: np.ndarray, cfg: GenerationConfig, tally: Tally | None = None, suppress: Sequence[int] = ()
) -> np.ndarray:
    """Logits [b, V] after the penalties and EOS suppression (a copy when any applies)."""
    if tally is None or tally.empty:
        tally = None
    seen = None if tally is None else tally.seen
    counts = None if tally is None or not cfg.counted else tally.counts
    if counts is not None or (seen is not None and cfg.repetition_penalty != 1.0) or suppress:
        logits = logits.astype(np.float32, copy=True)  # the one copy; the rest is in place
    if counts is not None:
        logits -= cfg.presence_penalty * (counts > 0)
        logits -= cfg.frequency_penalty * counts
    if seen is not None and cfg.repetition_penalty != 1.0:
        apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if suppress:
        logits[:, list(suppress)] = -np.inf
    return logits


def distribution(
    logits: np.ndarray, cfg: GenerationConfig, tally: Tally | None = None, suppress: Sequence[int] = ()
) -> np.ndarray:
    """The sampling distribution [b, V] float64 that `sample` draws from: penalties, then
    temperature, top-k and top-p. Greedy settings give each row's argmax probability 1."""
    logits = processed_logits(logits, cfg, tally, suppress)
    if not cfg.sampling:
        probs = np.zeros(logits.shape, dtype=np.float64)
        probs[np.arange(len(logits)), logits.argmax(axis=-1)] = 1.0
        return probs
    logits = logits.astype(np.float32, copy=True)
    if cfg.temperature is not None and cfg.temperature != 1.0:
        logits /= cfg.temperature
    if cfg.top_k:
        top_k_filter(logits, cfg.top_k)
    probs = softmax(logits.astype(np.float64))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        top_p_filter(probs, cfg.top_p)
    return probs


def draw(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row from probs [b, V] (rows need not be normalized) -> int64 [b]."""
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random((probs.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=-1), probs.shape[-1] - 1).astype(np.int64)


def sample(
    logits: np.ndarray,
    cfg: GenerationConfig,
    rng: np.random.Generator,
    tally: Tally | None = None,
    suppress: Sequence[int] = (),
) -> np.ndarray:
    """Next token per row: logits [b, V] -> int64 [b]. Never modifies `logits`."""
    if not cfg.sampling:
        return processed_logits(logits, cfg, tally, suppress).argmax(axis=-1).astype(np.int64, copy=False)
    return draw(distribution(logits, cfg, tally, suppress), rng)
