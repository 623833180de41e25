"""The decode loop: prefill once, then one token per step from the carried states; and the
time limit of a generation (timeout=: deadline_after, until).

Shapes: b = batch rows, l = prompt length, V = vocabulary size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import GenerationError, GenerationTimeout
from .prefix_cache import StateCache
from .prefix_plan import chunk_end
from .sampling import GenerationConfig, Tally, sample
from .state import Stepper

StopCheck = Callable[[Sequence[int]], bool]

# Prompts run in calls of at most this many tokens (exact: each call continues from the
# states of the last). Measured on the 125M bench models, 2 threads, a 1,900-token prompt:
# 128-token calls prefill 26% faster than one call on jamba-125m (the Mamba scans' working
# set stays in cache), 11% on llama-125m, 7% on granite-h-125m, and cap the transient memory.
PREFILL_CHUNK = 128


@dataclass
class GenerationStats:
    """What a generation did, filled in as it runs: the new tokens per row and timings."""

    tokens: list[list[int]] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens resumed from a prefix state cache, not prefilled
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens: int = 0
    route: str | None = None  # which model a router sent the call to (runtime.router)
    # Speculative decoding (runtime.speculative): drafts proposed, drafts kept, verify calls.
    draft_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0

    @classmethod
    def combine(cls, runs: Sequence[GenerationStats]) -> GenerationStats:
        """One record of generations run one after another (rows of a batch, in order)."""
        return cls(
            tokens=[t for r in runs for t in r.tokens],
            prompt_tokens=sum(r.prompt_tokens for r in runs),
            cached_tokens=sum(r.cached_tokens for r in runs),
            prefill_s=sum(r.prefill_s for r in runs),
            decode_s=sum(r.decode_s for r in runs),
            decode_tokens=sum(r.decode_tokens for r in runs),
            draft_tokens=sum(r.draft_tokens for r in runs),
            accepted_tokens=sum(r.accepted_tokens for r in runs),
            rounds=sum(r.rounds for r in runs),
        )

    @property
    def prefill_ms(self) -> float:
        return self.prefill_s * 1e3

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """The share of drafted tokens the target kept (NaN without a draft model)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else float("nan")

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def prefill(stepper: Stepper, prompts: Sequence[Sequence[int]]) -> np.ndarray:
    """Run the prompts (one per row) from the stepper's states; returns each row's
    last-position logits [b, V]. Prompts of one length run as one call (unless they span
    several chunks where a chunk after a past takes one row: Stepper.batched_chunks);
    otherwise each row runs alone from fresh states and its states move into its row (no
    padding: every row ends exactly as it would alone)."""
    one_call = len(prompts) == 1 or stepper.batched_chunks or len(prompts[0]) <= PREFILL_CHUNK
    if len({len(p) for p in prompts}) == 1 and one_call:
        return feed(stepper, np.asarray(prompts, dtype=np.int64))
    logits = np.empty((len(prompts), stepper.vocab), dtype=np.float32)
    for r, p in enumerate(prompts):
        one = stepper.fresh(1)
        logits[r] = feed(one, np.asarray([p], dtype=np.int64))[0]
        stepper.set_row(r, one.states(), int(stepper.lengths[r]) + len(p))
    return logits


def feed(stepper: Stepper, ids: np.ndarray) -> np.ndarray:
    """ids [b, l] in calls of at most PREFILL_CHUNK tokens; the last position's logits [b, V]."""
    for start in range(0, ids.shape[1], PREFILL_CHUNK):
        logits = stepper.forward(ids[:, start : start + PREFILL_CHUNK])
    return logits


def prefill_cached(stepper: Stepper, tokens: Sequence[int], cache: StateCache) -> tuple[np.ndarray, int]:
    """Bring row 0 (which has seen tokens[:stepper.lengths[0]]) to the end of `tokens` from the
    deepest state `cache` holds for them, storing states at its checkpoints on the way
    (runtime.prefix_cache); returns the last logits [1, V] and the tokens resumed from it."""
    seen = continued = int(stepper.lengths[0])  # the row's own tokens: a ChatSession's, continued exactly
    hit = cache.lookup(tokens)
    resumed = 0
    if hit is not None and hit.snapshot.length > seen:
        if stepper.has_kv and len(tokens) > stepper.capacity:
            stepper.grow(len(tokens))  # set_row keeps at most the capacity's positions
        stepper.set_row(0, hit.snapshot.states, hit.snapshot.length)
        resumed = seen = hit.snapshot.length
        if hit.logits is not None:
            return hit.logits, resumed
    if seen >= len(tokens):
        raise ValueError(f"nothing to prefill: the states have seen {seen} of {len(tokens)} tokens")
    marks = cache.plan(tokens, seen, tail=not (continued and seen == continued))
    ids = np.asarray([tokens], dtype=np.int64)
    while seen < len(tokens):
        end = chunk_end(seen, PREFILL_CHUNK, len(tokens), marks)
        t0 = time.perf_counter()
        logits = stepper.forward(ids[:, seen:end])
        cache.observe(end - seen, time.perf_counter() - t0)
        seen = end
        if end in marks:
            cache.put(tokens[:end], stepper.row(0, cache.blocks), logits if end == len(tokens) else None)
    return logits, resumed


def decode_step(stepper: Stepper, tokens: np.ndarray) -> np.ndarray:
    """Feed one token per row [b] from the carried states; returns logits [b, V]."""
    return stepper.forward(tokens[:, None])


def generate(
    stepper: Stepper,
    prompts: Sequence[Sequence[int]],
    cfg: GenerationConfig,
    eos: Sequence[int],
    pad_id: int,
    stats: GenerationStats,
    history: Sequence[Sequence[int]] | None = None,
    stop: StopCheck | None = None,
    cache: StateCache | None = None,
) -> Iterator[np.ndarray]:
    """Prefill `prompts`, then sample up to cfg.max_new_tokens; yields each step's tokens [b].

    A row stops after an EOS token (kept in its output, as transformers does) or when `stop`
    says its tokens so far end it; finished rows are fed `pad_id` and not recorded.
    `history` (default: the prompts) is what the repetition penalty counts as seen; presence
    and frequency penalties count the tokens generated here.
    With a prefix state `cache` (one row; `history`, when given, is every token of the row,
    of which the stepper has seen all but `prompts`), the prefill resumes from the cache and
    stores states in it, and the states after the reply are stored when it ends.
    """
    b = len(prompts)
    rng = np.random.default_rng(cfg.seed)
    stats.tokens = [[] for _ in range(b)]
    stats.prompt_tokens = sum(len(p) for p in prompts)
    context = list((history or prompts)[0]) if cache is not None else []
    t0 = time.perf_counter()
    if cache is not None:
        logits, stats.cached_tokens = prefill_cached(stepper, context, cache)
    else:
        logits = prefill(stepper, prompts)
    stats.prefill_s = time.perf_counter() - t0
    tally = Tally.start(cfg, history or prompts, stepper.vocab)
    eos_ids = np.asarray(eos, dtype=np.int64)
    rows = np.arange(b)
    live = np.ones(b, dtype=bool)
    t0 = time.perf_counter()
    try:
        for step in range(cfg.max_new_tokens):
            tokens = sample(logits, cfg, rng, tally, cfg.suppressed(eos, step))
            tokens[~live] = pad_id
            if not tally.empty:
                tally.add(tokens[live], rows[live])
            live = _record(stats.tokens, tokens, live, eos_ids, stop)
            yield tokens
            if not live.any() or step + 1 == cfg.max_new_tokens:
                break
            logits = decode_step(stepper, tokens)
            stats.decode_tokens += int(live.sum())
    finally:
        stats.decode_s = time.perf_counter() - t0
        if cache is not None and stats.tokens[0]:
            reply_end = context + stats.tokens[0][:-1]
            if int(stepper.lengths[0]) == len(reply_end):  # a chat turn continues from here
                cache.put(reply_end, stepper.row(0, cache.blocks))


def _record(
    out: list[list[int]], tokens: np.ndarray, live: np.ndarray, eos: np.ndarray, stop: StopCheck | None
) -> np.ndarray:
    """Append each live row's token; returns which rows go on."""
    finished = (tokens[:, None] == eos[None, :]).any(axis=1)  # np.isin costs ~10x more per step
    for r in np.flatnonzero(live):
        out[r].append(int(tokens[r]))
        if stop is not None and not finished[r] and stop(out[r]):
            finished[r] = True
    return live & ~finished


def deadline_after(timeout: float | None) -> float | None:
    """The monotonic time a call with `timeout` seconds must stop by (None: no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise GenerationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    return time.monotonic() + float(timeout)


def until(steps: Iterator[Any], deadline: float | None, stats: GenerationStats) -> Iterator[Any]:
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
