"""Helpers of the prefix cache's tests (test_prefix_cache, test_kv_pieces): prompts, a cold
prefill's logits, and a prefill resumed from a cache."""

from __future__ import annotations

import numpy as np

import hybridrt
from hybridrt.runtime.decode import prefill_cached
from hybridrt.runtime.prefix_cache import StateCache


def random_prompt(length: int, seed: int = 0, vocab: int = 320) -> list[int]:
    return np.random.default_rng(seed + 1000 * length).integers(3, vocab, length).tolist()


def parted(tokens: list[int], at: int) -> list[int]:
    """tokens up to `at`, then one token other than the next: a prompt that parts from them there
    (it resumes from a state stored at `at`, not from a deeper one on their path)."""
    return tokens[:at] + [4 if tokens[at] == 3 else 3]


def cold_prefill(model: hybridrt.runtime.Model, tokens: list[int]) -> np.ndarray:
    """The last logits [1, V] of `tokens` prefilled in one call from fresh states."""
    stepper = model.stepper(1, len(tokens) + 4)
    return np.array(stepper.forward(np.asarray([tokens], dtype=np.int64)))


def cached_prefill(model: hybridrt.runtime.Model, tokens: list[int], cache: StateCache) -> tuple[np.ndarray, int]:
    """The last logits [1, V] of `tokens` prefilled from the deepest state `cache` holds for
    them, and the tokens resumed."""
    stepper = model.stepper(1, len(tokens) + 4)
    logits, resumed = prefill_cached(stepper, tokens, cache)
    return np.array(logits), resumed
