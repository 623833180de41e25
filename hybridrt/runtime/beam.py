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

import time
from collections.abc import Sequence

import numpy as np

from .decode import GenerationStats, decode_step, prefill, seen_tokens
from .sampling import GenerationConfig, apply_repetition_penalty
from .state import Stepper

NEVER = np.float32(-1.0e9)


def beam_search(
    stepper: Stepper,
    prompts: Sequence[Sequence[int]],
    cfg: GenerationConfig,
    eos: Sequence[int],
    stats: GenerationStats,
) -> list[list[int]]:
    """The best cfg.num_return_sequences continuations of each prompt, best first, prompt-major
    (b * num_return_sequences lists of new tokens, each ending with its EOS token, kept as
    transformers keeps it, or after max_new_tokens). The stepper holds b * k fresh rows."""
    b, k, n = len(prompts), cfg.num_beams, cfg.max_new_tokens
    eos_ids = np.asarray(eos, dtype=np.int64)
    K = max(2, 1 + len(eos_ids)) * k
    top_k_mask = np.arange(K) < k  # only the first k candidates may finish
    lp = float(cfg.length_penalty)
    stop_when_full = not isinstance(cfg.early_stopping, str) and bool(cfg.early_stopping)
    longest = n if isinstance(cfg.early_stopping, str) and lp > 0 else None  # early_stopping="never"

    run_tokens = np.zeros((b, k, n), dtype=np.int64)
    run_scores = np.zeros((b, k), dtype=np.float32)
    run_scores[:, 1:] = NEVER  # the first step expands beam 0 alone (the others are its copies)
    fin_tokens = np.zeros((b, k, n), dtype=np.int64)
    fin_lengths = np.zeros((b, k), dtype=np.int64)
    fin_scores = np.full((b, k), NEVER, dtype=np.float32)
    finished = np.zeros((b, k), dtype=bool)
    improvable = np.ones((b, 1), dtype=bool)  # transformers' is_early_stop_heuristic_unsatisfied
    prompt_seen = seen_tokens(prompts, stepper.vocab) if cfg.repetition_penalty != 1.0 else None

    stats.prompt_tokens = sum(len(p) for p in prompts)
    t0 = time.perf_counter()
    logits = _prefill_beams(stepper, prompts, k)
    stats.prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for step in range(n):
        log_probs = _log_probs(logits, cfg, prompt_seen, run_tokens[:, :, :step], eos_ids, step)
        scores = log_probs.reshape(b, k, -1) + run_scores[:, :, None]
        cand_scores, origin, tokens = _continuations(scores, K)
        cand_tokens = np.take_along_axis(run_tokens, origin[:, :, None], axis=1)
        cand_tokens[:, :, step] = tokens
        ends = np.isin(tokens, eos_ids) | (step + 1 == n)

        # The best k candidates that do not end run on (_get_running_beams_for_next_iteration).
        running = cand_scores + ends.astype(np.float32) * NEVER
        keep = _top(running, k)
        run_tokens = np.take_along_axis(cand_tokens, keep[:, :, None], axis=1)
        run_scores = np.take_along_axis(running, keep, axis=1)
        run_origin = np.take_along_axis(origin, keep, axis=1)

        # New hypotheses replace worse ones (_update_finished_beams).
        just_finished = ends & top_k_mask
        scored = cand_scores / ((step + 1) ** lp)
        scored += (finished.all(axis=1, keepdims=True) & stop_when_full).astype(np.float32) * NEVER
        scored += (~improvable).astype(np.float32) * NEVER
        scored += (~just_finished).astype(np.float32) * NEVER
        best = _top(np.concatenate([fin_scores, scored], axis=1), k)
        fin_scores = np.take_along_axis(np.concatenate([fin_scores, scored], axis=1), best, axis=1)
        fin_tokens = np.take_along_axis(np.concatenate([fin_tokens, cand_tokens], axis=1), best[:, :, None], axis=1)
        new_lengths = np.full((b, K), step + 1, dtype=np.int64)
        fin_lengths = np.take_along_axis(np.concatenate([fin_lengths, new_lengths], axis=1), best, axis=1)
        finished = np.take_along_axis(np.concatenate([finished, just_finished], axis=1), best, axis=1)

        # Can a running beam still beat the worst hypothesis (_check_early_stop_heuristic)?
        hoped = run_scores[:, :1] / ((longest or step + 1) ** lp)
        worst = np.where(finished, fin_scores.min(axis=1, keepdims=True), NEVER)
        improvable &= (hoped > worst).any(axis=-1, keepdims=True)
        if not improvable.any() or (finished.all() and stop_when_full) or ends.all():
            break
        stepper.reorder((run_origin + np.arange(b)[:, None] * k).reshape(-1))
        logits = decode_step(stepper, run_tokens[:, :, step].reshape(-1))
        stats.decode_tokens += b * k
    stats.decode_s = time.perf_counter() - t0
    r = cfg.num_return_sequences
    return [fin_tokens[i, j, : fin_lengths[i, j]].tolist() for i in range(b) for j in range(r)]


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
    """log-softmax of logits [b * k, V] in float32, then transformers' processors: the
    repetition penalty over each beam's prompt and tokens [b, k, step], and EOS at -inf
    before min_new_tokens."""
    x = logits.astype(np.float32)
    shifted = x - x.max(axis=-1, keepdims=True)
    out = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    if prompt_seen is not None:
        b, k, _ = tokens.shape
        seen = np.repeat(prompt_seen, k, axis=0)
        seen[np.repeat(np.arange(b * k), step), tokens.reshape(-1)] = True
        apply_repetition_penalty(out, seen, cfg.repetition_penalty)
    if step < cfg.min_new_tokens and len(eos):
        out[:, eos] = -np.inf
    return out


def _continuations(scores: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best K of every beam's continuations, scores [b, k, V] -> (their scores, origin
    beams, tokens), each [b, K], best first (_get_top_k_continuations)."""
    b, _, V = scores.shape
    flat = scores.reshape(b, -1)
    best = _top(flat, K)
    return np.take_along_axis(flat, best, axis=1), best // V, best % V


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's k largest values [b, k], largest first (torch.topk; ties by index)."""
    part = np.argpartition(-x, k - 1, axis=-1)[:, :k] if k < x.shape[-1] else np.arange(x.shape[-1])[None]
    part = np.broadcast_to(part, (x.shape[0], k))
    values = np.take_along_axis(x, part, axis=-1)
    return np.take_along_axis(part, np.lexsort((part, -values), axis=-1), axis=-1)
