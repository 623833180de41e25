"""Rows: sequences that run together through the graph, states with a batch dimension.

The engine keeps one Rows for the decode batch and one per request being prefilled. Rows
join (`extend`) and leave (`take`) between steps; nothing is recomputed when they do.

Shapes: b = rows, s = new tokens this call, C = KV capacity, V = vocabulary. Row r has seen
`count[r]` tokens; its keys and values sit at positions 0 .. count[r]-1 of its KV buffers
(the graph writes each row at its own length), so rows of any lengths share a call. SSM and
conv states have a fixed size per row; KV buffers [b, kv_heads, C, head_dim] are widened
(zero positions on the right, doubling) when a row needs more room.
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


class Rows:
    """States [b, ...] of `b` sequences, KV buffers of `capacity` positions, `count` [b] tokens seen."""

    def __init__(self, graph: Graph, states: list[np.ndarray], capacity: int, count: np.ndarray) -> None:
        self.graph = graph
        self.states = states
        self.capacity = capacity
        self.count = count

    @classmethod
    def fresh(cls, graph: Graph, batch: int = 1, capacity: int = 0) -> Rows:
        states = list(zero_states(graph.pasts, batch, capacity).values())  # in the order of graph.pasts
        return cls(graph, states, capacity, np.zeros(batch, dtype=np.int64))

    @property
    def batch(self) -> int:
        return len(self.count)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.states)

    def run(self, ids: np.ndarray) -> np.ndarray:
        """Feed ids [b, s] (s new tokens for every row); returns last-position logits [b, V]."""
        s = ids.shape[1]
        self.reserve(int(self.count.max(initial=0)) + s)
        states = {spec.name: x for spec, x in zip(self.graph.pasts, self.states)}
        feeds = graph_feeds(self.graph.inputs, ids, self.count, states)
        logits, *self.states = self.graph.session.run(None, feeds)
        self.count = self.count + s
        return logits[:, -1]

    def reserve(self, need: int) -> None:
        """KV buffers of at least `need` positions (doubling, so widening is rare)."""
        if need > self.capacity:
            self._widen(max(need, 2 * self.capacity))

    def _widen(self, capacity: int) -> None:
        self.states = [_pad_kv(x, spec, capacity) for spec, x in zip(self.graph.pasts, self.states)]
        self.capacity = capacity

    def take(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in that order)."""
        self.states = [x[keep] for x in self.states]
        self.count = self.count[keep]

    def extend(self, other: Rows) -> None:
        """Append other's rows after ours (KV buffers widened to the larger capacity)."""
        capacity = max(self.capacity, other.capacity)
        self._widen(capacity)
        other = other.copy()
        other._widen(capacity)
        self.states = [np.concatenate([a, b], axis=0) for a, b in zip(self.states, other.states)]
        self.count = np.concatenate([self.count, other.count])

    def row(self, r: int) -> Rows:
        """A copy of row r alone, its KV cut to the positions it holds (for the prefix cache)."""
        n = int(self.count[r])
        states = [
            np.ascontiguousarray(_cut_kv(x[r : r + 1], spec, n)) for spec, x in zip(self.graph.pasts, self.states)
        ]
        return Rows(self.graph, states, n, self.count[r : r + 1].copy())

    def copy(self) -> Rows:
        return Rows(self.graph, [x.copy() for x in self.states], self.capacity, self.count.copy())


def _pad_kv(x: np.ndarray, spec: TensorSpec, capacity: int) -> np.ndarray:
    axis = spec.kv_axis
    if axis is None or x.shape[axis] >= capacity:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, capacity - x.shape[axis])
    return np.pad(x, widths)


def _cut_kv(x: np.ndarray, spec: TensorSpec, n: int) -> np.ndarray:
    axis = spec.kv_axis
    return x if axis is None else np.take(x, np.arange(n), axis=axis)
