"""Beam search over a Stepper, step for step as transformers 5.23's `GenerationMixin._beam_search`
(generation/utils.py, with its helpers `_get_top_k_continuations`,
`_get_running_beams_for_next_iteration`, `_update_finished_beams`, `_check_early_stop_heuristic`
and `_beam_search_has_unfinished_sequences`), in numpy float32.

Each prompt keeps k running beams and k finished hypotheses. A step takes the log-softmax of
each running beam's logits, applies the logits processors transformers applies (repetition
penalty over the beam's prompt and tokens, EOS suppressed before min_new_tokens) and adds the
beam's score; the best K continuations of each prompt follow. Those that end (an EOS token, or
the max_new_tokens-th token) and rank among the first k become hypotheses scored
score / generated_length ** length_penalty; the best k that do not end run on, and the
stepper's rows are reordered to their origin beams. early_stopping decides, per prompt, when no
running beam can beat the hypotheses any more.

Stepper rows are prompt-major: row i * k + j is beam j of prompt i. transformers marks what
can never be chosen with a score of -1e9; so does this module (NEVER).

Shapes: b = prompts, k = num_beams, K = candidates per step (2k, or (1 + EOS ids) * k),
n = max_new_tokens, V = vocabulary size.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from .decode import GenerationStats, decode_step, prefill
from .sampling import GenerationConfig, Tally, processed_logits
from .state import Stepper

NEVER = np.float32(-1.0e9)


@dataclass
class Beams:
    """Sequences of new tokens, j per prompt: tokens [b, j, n] (each row's first `lengths`
    [b, j] are its own), scores [b, j] float32, and (hypotheses) whether each is a finished
    sequence rather than a placeholder [b, j]."""

    tokens: np.ndarray
    scores: np.ndarray
    lengths: np.ndarray
    finished: np.ndarray

    def take(self, index: np.ndarray) -> Beams:
        """Sequences index [b, j'] of each prompt (transformers' `_gather_beams`)."""
        pick = functools.partial(np.take_along_axis, indices=index, axis=1)
        tokens = np.take_along_axis(self.tokens, index[:, :, None], axis=1)
        return Beams(tokens, pick(self.scores), pick(self.lengths), pick(self.finished))

    def join(self, other: Beams) -> Beams:
        """Both sets of sequences, per prompt: [b, j + j', ...]."""
        pairs = ((getattr(self, f.name), getattr(other, f.name)) for f in fields(self))
        return Beams(*(np.concatenate(pair, axis=1) for pair in pairs))


def _beams(b: int, k: int, n: int, scores: np.ndarray) -> Beams:
    return Beams(np.zeros((b, k, n), np.int64), scores, np.zeros((b, k), np.int64), np.zeros((b, k), bool))


def beam_search(
    stepper: Stepper,
    prompts: Sequence[Sequence[int]],
    cfg: GenerationConfig,
    eos: Sequence[int],
    stats: GenerationStats,
) -> list[list[int]]:
    """The best cfg.num_return_sequences continuations of each prompt, best first, prompt-major
    (b * num_return_sequences lists of new tokens, each ending with its EOS token, kept as
    transformers keeps it, or after max_new_tokens); also in stats.tokens. The stepper holds
    b * k fresh rows; stats.decode_tokens counts the rows fed (b * k per step)."""
    b, k, n = len(prompts), cfg.num_beams, cfg.max_new_tokens
    eos_ids = np.asarray(eos, dtype=np.int64)
    K = max(2, 1 + len(eos_ids)) * k
    top_k_mask = np.arange(K) < k  # only the first k candidates may finish
    first = np.full((b, k), NEVER, dtype=np.float32)
    first[:, 0] = 0.0  # the first step expands beam 0 alone (the others are its copies)
    running = _beams(b, k, n, first)
    hypotheses = _beams(b, k, n, np.full((b, k), NEVER, dtype=np.float32))
    improvable = np.ones((b, 1), dtype=bool)  # transformers' is_early_stop_heuristic_unsatisfied
    prompt_seen = Tally.start(cfg, prompts, stepper.vocab).seen

    stats.prompt_tokens = sum(len(p) for p in prompts)
    t0 = time.perf_counter()
    logits = _prefill_beams(stepper, prompts, k)
    stats.prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for step in range(n):
        log_probs = _log_probs(logits, cfg, prompt_seen, running.tokens[:, :, :step], eos_ids, step)
        candidates, origin = _continuations(running, log_probs.reshape(b, k, -1), step, K)
        ends = np.isin(candidates.tokens[:, :, step], eos_ids) | (step + 1 == n)
        # The best k candidates that do not end run on (_get_running_beams_for_next_iteration).
        ongoing = candidates.scores + ends.astype(np.float32) * NEVER
        keep = _top(ongoing, k)
        running = replace(candidates, scores=ongoing).take(keep)
        hypotheses = _update_hypotheses(hypotheses, candidates, ends & top_k_mask, improvable, step, cfg)
        improvable &= _can_improve(running, hypotheses, step, cfg)
        # Go on while some prompt can improve, unless early_stopping=True and every prompt has its
        # k hypotheses, or every candidate ended (_beam_search_has_unfinished_sequences).
        stop_when_full = hypotheses.finished.all() and _stops_when_full(cfg)
        if not improvable.any() or stop_when_full or ends.all():
            break
        stepper.reorder((np.take_along_axis(origin, keep, axis=1) + np.arange(b)[:, None] * k).reshape(-1))
        logits = decode_step(stepper, running.tokens[:, :, step].reshape(-1))
        stats.decode_tokens += b * k
    stats.decode_s = time.perf_counter() - t0
    r = cfg.num_return_sequences
    best = hypotheses.take(np.broadcast_to(np.arange(r), (b, r)))
    stats.tokens = [best.tokens[i, j, : best.lengths[i, j]].tolist() for i in range(b) for j in range(r)]
    return stats.tokens


def _stops_when_full(cfg: GenerationConfig) -> bool:
    """early_stopping=True: a prompt is done once it has k hypotheses."""
    return not isinstance(cfg.early_stopping, str) and bool(cfg.early_stopping)


def _continuations(running: Beams, log_probs: np.ndarray, step: int, K: int) -> tuple[Beams, np.ndarray]:
    """The best K continuations of the running beams [b, k] given each beam's next-token
    log-probs [b, k, V], best first, with the beam each continues [b, K]
    (_get_top_k_continuations)."""
    b, _, V = log_probs.shape
    scores = (log_probs + running.scores[:, :, None]).reshape(b, -1)
    best = _top(scores, K)
    origin = best // V
    candidates = running.take(origin)
    candidates.tokens[:, :, step] = best % V
    candidates.scores = np.take_along_axis(scores, best, axis=1)
    candidates.lengths[:] = step + 1
    return candidates, origin


def _update_hypotheses(
    hypotheses: Beams, candidates: Beams, ended: np.ndarray, improvable: np.ndarray, step: int, cfg: GenerationConfig
) -> Beams:
    """The best k of the hypotheses and the candidates that `ended` [b, K], these scored by
    score / generated_length ** length_penalty, unless their prompt is done
    (_update_finished_beams: -1e9 added in the same order, for the same float32 sums)."""
    scores = candidates.scores / ((step + 1) ** float(cfg.length_penalty))
    scores += (hypotheses.finished.all(axis=1, keepdims=True) & _stops_when_full(cfg)).astype(np.float32) * NEVER
    scores += (~improvable).astype(np.float32) * NEVER
    scores += (~ended).astype(np.float32) * NEVER
    merged = hypotheses.join(replace(candidates, scores=scores, finished=ended))
    return merged.take(_top(merged.scores, hypotheses.scores.shape[1]))


def _can_improve(running: Beams, hypotheses: Beams, step: int, cfg: GenerationConfig) -> np.ndarray:
    """[b, 1]: could the best running beam still beat the worst hypothesis
    (_check_early_stop_heuristic)? Its score is judged at the current length, or at
    max_new_tokens with early_stopping="never" and a positive length_penalty."""
    lp = float(cfg.length_penalty)
    never = isinstance(cfg.early_stopping, str)
    length = cfg.max_new_tokens if never and lp > 0 else step + 1
    hoped = running.scores[:, :1] / (length**lp)
    worst = np.where(hypotheses.finished, hypotheses.scores.min(axis=1, keepdims=True), NEVER)
    return np.asarray((hoped > worst).any(axis=-1, keepdims=True))


def _prefill_beams(stepper: Stepper, prompts: Sequence[Sequence[int]], k: int) -> np.ndarray:
    """Prefill each prompt once (rows of a b-row stepper), copy its states to its k beams;
    returns each beam's logits [b * k, V]."""
    b = len(prompts)
    alone = stepper.fresh(b)
    logits = prefill(alone, prompts)
    states = alone.states()
    for i, p in enumerate(prompts):
        stepper.set_row(i, [x[i : i + 1] for x in states], len(p))
    stepper.reorder(np.repeat(np.arange(b, dtype=np.int64), k))
    return np.repeat(logits, k, axis=0)


def _log_probs(
    logits: np.ndarray,
    cfg: GenerationConfig,
    prompt_seen: np.ndarray | None,
    tokens: np.ndarray,
    eos: np.ndarray,
    step: int,
) -> np.ndarray:
    """log-softmax of logits [b * k, V] in float32, then transformers' processors (sampling's
    processed_logits): the penalties over each beam's prompt and tokens [b, k, step], and EOS
    at -inf before min_new_tokens."""
    x = logits.astype(np.float32)
    shifted = x - x.max(axis=-1, keepdims=True)
    out = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    tally = None
    if prompt_seen is not None or cfg.counted:
        b, k, _ = tokens.shape
        seen = None if prompt_seen is None else np.repeat(prompt_seen, k, axis=0)
        tally = Tally(seen, np.zeros(out.shape, dtype=np.float32) if cfg.counted else None)
        tally.add(tokens.reshape(-1), np.repeat(np.arange(b * k), step))
    return processed_logits(out, cfg, tally, cfg.suppressed(eos.tolist(), step))


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's k largest values [b, k], largest first (torch.topk; ties by index)."""
    part = np.argpartition(-x, k - 1, axis=-1)[:, :k] if k < x.shape[-1] else np.arange(x.shape[-1])[None]
    part = np.broadcast_to(part, (x.shape[0], k))
    values = np.take_along_axis(x, part, axis=-1)
    return np.take_along_axis(part, np.lexsort((part, -values), axis=-1), axis=-1)
