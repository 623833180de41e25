"""Rows: sequences that run together through the graph, states with a batch dimension.

The engine keeps one Rows for the decode batch and one per request being prefilled. Rows
join (`extend`) and leave (`take`) between steps; nothing is recomputed when they do.

Shapes: b = rows, s = new tokens this call, P = past length (KV columns, left padding
included), V = vocabulary. Each row's real tokens are the last `count[r]` of the P columns
(left padding), so the attention mask is derived from `count` and never stored:
mask[r] = [0] * (P - count[r]) + [1] * count[r]. SSM and conv states have a fixed size per
row; KV tensors [b, kv_heads, P, head_dim] are padded on the left to the longest row when
rows join, and trimmed when the longest row leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..graphs.contract import TensorSpec
from ..graphs.feeds import graph_feeds, zero_states
from ..runtime.model import Model


@dataclass(frozen=True)
class Graph:
    """What running the graph needs: the session, its declared inputs and state specs."""

    session: Any
    inputs: tuple[TensorSpec, ...]
    pasts: tuple[TensorSpec, ...]
    vocab: int

    @classmethod
    def of(cls, model: Model) -> Graph:
        m = model.manifest
        return cls(model.inference_session, tuple(m.inputs), tuple(m.pasts), int(m.vocab_size))

    def kv_axis(self, spec: TensorSpec) -> int | None:
        """The axis that grows per token (KV), or None for a fixed-size state."""
        return next((i for i, d in enumerate(spec.dims) if d in ("past_len", "total_len")), None)


class Rows:
    """States [b, ...] of `b` sequences, `length` = P columns of past, `count` [b] real tokens."""

    def __init__(self, graph: Graph, states: list[np.ndarray], length: int, count: np.ndarray) -> None:
        self.graph = graph
        self.states = states
        self.length = length
        self.count = count

    @classmethod
    def fresh(cls, graph: Graph, batch: int = 1) -> Rows:
        states = list(zero_states(graph.pasts, batch).values())  # in the order of graph.pasts
        return cls(graph, states, 0, np.zeros(batch, dtype=np.int64))

    @property
    def batch(self) -> int:
        return len(self.count)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.states)

    def mask(self, extra: int = 0) -> np.ndarray:
        """[b, P + extra] int64: 1 for each row's real tokens (and `extra` new ones)."""
        cols = np.arange(self.length)[None, :]
        past = (cols >= self.length - self.count[:, None]).astype(np.int64)
        return np.concatenate([past, np.ones((self.batch, extra), np.int64)], axis=1)

    def run(self, ids: np.ndarray) -> np.ndarray:
        """Feed ids [b, s] (no padding inside a call); returns last-position logits [b, V]."""
        s = ids.shape[1]
        states = {spec.name: x for spec, x in zip(self.graph.pasts, self.states)}
        feeds = graph_feeds(self.graph.inputs, ids, self.mask(s), states)  # positions: count + arange
        logits, *self.states = self.graph.session.run(None, feeds)
        self.length += s
        self.count = self.count + s
        return logits[:, -1]

    def take(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in that order); drop past columns that only padded the others."""
        count = self.count[keep]
        length = int(count.max()) if len(count) else 0
        start = self.length - length
        states = []
        for spec, x in zip(self.graph.pasts, self.states):
            x = x[keep]
            axis = self.graph.kv_axis(spec)
            if axis is not None and start:
                x = np.take(x, np.arange(start, self.length), axis=axis)
            states.append(x)
        self.states, self.length, self.count = states, length, count

    def extend(self, other: Rows) -> None:
        """Append other's rows after ours, left-padding the shorter past."""
        length = max(self.length, other.length)
        states = []
        for spec, a, b in zip(self.graph.pasts, self.states, other.states):
            axis = self.graph.kv_axis(spec)
            if axis is not None:
                a, b = _left_pad(a, axis, length), _left_pad(b, axis, length)
            states.append(np.concatenate([a, b], axis=0))
        self.states, self.length = states, length
        self.count = np.concatenate([self.count, other.count])

    def row(self, r: int) -> Rows:
        """A copy of row r alone, without padding (for the prefix cache)."""
        one = Rows(self.graph, [np.array(x[r : r + 1]) for x in self.states], self.length, self.count[r : r + 1])
        one.take([0])
        one.states = [np.ascontiguousarray(x) for x in one.states]
        return one

    def copy(self) -> Rows:
        return Rows(self.graph, [x.copy() for x in self.states], self.length, self.count.copy())


def _left_pad(x: np.ndarray, axis: int, length: int) -> np.ndarray:
    missing = length - x.shape[axis]
    if missing == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (missing, 0)
    return np.pad(x, widths)
