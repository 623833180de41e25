"""The graph's feeds, built in one place: the runtime's decode loop and evaluation,
quantization's calibration, and export's tracing and parity check all call `graph_feeds`.
Torch-free (numpy).

Shapes: b = batch, s = new tokens this call, p = past length, so a mask is [b, p + s].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .contract import TensorSpec

POSITION_IDS = "position_ids"
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}


def takes_positions(inputs: Sequence[TensorSpec]) -> bool:
    """Whether a graph with these declared inputs takes `position_ids` (the contract declares
    it from HybridConfig.uses_positions; a loaded graph answers from its manifest)."""
    return any(s.name == POSITION_IDS for s in inputs)


def position_ids(mask: np.ndarray, seq: int) -> np.ndarray:
    """Positions [b, s] of the last `seq` columns of mask [b, p + s]: tokens count, left
    padding does not, so a padded row gets the positions it would have alone (as transformers)."""
    pos = np.cumsum(mask, axis=1, dtype=np.int64) - 1
    return np.ascontiguousarray(np.maximum(pos, 0)[:, mask.shape[1] - seq :])


def graph_feeds(
    inputs: Sequence[TensorSpec], ids: np.ndarray, mask: np.ndarray, states: Mapping[str, Any]
) -> dict[str, Any]:
    """The feeds for ids [b, s] (int64) whose mask [b, p + s] covers the past and the new
    tokens, with `states` (past name -> tensor) as the pasts."""
    feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if takes_positions(inputs):
        feeds[POSITION_IDS] = position_ids(mask, ids.shape[1])
    feeds.update(states)
    return feeds


def state_shape(spec: TensorSpec, batch: int, past_len: int = 0) -> tuple[int, ...]:
    """Concrete shape of a past tensor: fresh sequences have a KV past of length 0."""
    sizes = {"batch": batch, "past_len": past_len}
    return tuple(d if isinstance(d, int) else sizes[d] for d in spec.dims)


def zero_states(pasts: Sequence[TensorSpec], batch: int) -> dict[str, np.ndarray]:
    """Zero conv/ssm states and empty KV pasts for `batch` fresh sequences."""
    return {s.name: np.zeros(state_shape(s, batch), NUMPY_DTYPES[s.dtype]) for s in pasts}
