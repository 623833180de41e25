"""The graph's feeds, built in one place: the runtime's decode loop and evaluation,
quantization's calibration, and export's tracing and parity check all call `graph_feeds`.
Torch-free (numpy).

Shapes: b = batch, s = new tokens this call, C = KV capacity (positions a buffer holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .contract import TensorSpec

PAST_LENGTHS = "past_lengths"
LOGIT_POSITIONS = "logit_positions"
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32, "int8": np.int8}


def takes_lengths(inputs: Sequence[TensorSpec]) -> bool:
    """Whether a graph with these declared inputs takes `past_lengths` (models with KV)."""
    return any(s.name == PAST_LENGTHS for s in inputs)


def logit_positions(seq: int, all_positions: bool = False, last: int = 1) -> np.ndarray:
    """[n] int64: the `last` positions of a call of `seq` tokens (default the last one), or
    every position."""
    return np.arange(0 if all_positions else seq - last, seq, dtype=np.int64)


def graph_feeds(
    inputs: Sequence[TensorSpec],
    ids: np.ndarray,
    past_lengths: np.ndarray | int,
    states: Mapping[str, Any],
    all_logits: bool = False,
    last: int = 1,
) -> dict[str, Any]:
    """The feeds for ids [b, s] (int64) after `past_lengths` [b] tokens (or one count for
    every row), with `states` (past name -> tensor) as the pasts. Logits come for the `last`
    positions (default the last one), or for every position with `all_logits`."""
    positions = logit_positions(ids.shape[1], all_logits, last)
    feeds: dict[str, Any] = {"input_ids": ids, LOGIT_POSITIONS: positions}
    if takes_lengths(inputs):
        lengths = np.broadcast_to(np.asarray(past_lengths, dtype=np.int64), (ids.shape[0],))
        feeds[PAST_LENGTHS] = lengths.copy()
    feeds.update(states)
    return feeds


def state_shape(spec: TensorSpec, batch: int, capacity: int = 0) -> tuple[int, ...]:
    """Concrete shape of a past tensor; KV buffers hold `capacity` positions."""
    sizes = {"batch": batch, "capacity": capacity}
    return tuple(d if isinstance(d, int) else sizes[d] for d in spec.dims)


def zero_states(pasts: Sequence[TensorSpec], batch: int, capacity: int) -> dict[str, np.ndarray]:
    """Zero states for `batch` fresh sequences, KV buffers of `capacity` positions."""
    return {s.name: np.zeros(state_shape(s, batch, capacity), NUMPY_DTYPES[s.dtype]) for s in pasts}
