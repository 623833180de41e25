"""Rows: sequences that run together through the graph, states with a batch dimension.

The engine keeps one Rows for the decode batch and one per request being prefilled. Rows
join (`extend`) and leave (`take`) between steps; nothing is recomputed when they do.

Shapes: b = rows, s = new tokens this call, C = KV capacity, V = vocabulary. Row r has seen
`count[r]` tokens; its keys and values sit at positions 0 .. count[r]-1 of its KV buffers
(the graph writes each row at its own length), so rows of any lengths share a call. SSM and
conv states have a fixed size per row; KV buffers [b, kv_heads, C, head_dim] are widened
(zero positions on the right, doubling) when a row needs more room.

A call binds the states in place (IO binding over the numpy arrays, which the OrtValues
alias): each KV buffer is both past and present, so the graph writes the new keys and
values into it and a decode step copies no KV; the fixed-size states alternate between the
array and a spare of the same shape. The bindings are built again only when the arrays
change (a row joins or leaves, a buffer widens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..graphs.contract import TensorSpec, present_name
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
        self.capacity = capacity
        self.count = count
        self.states = states

    @property
    def states(self) -> list[np.ndarray]:
        return self._states

    @states.setter
    def states(self, states: list[np.ndarray]) -> None:
        self._states = [np.ascontiguousarray(x) for x in states]
        self._bindings: list[Any] = []  # built by the next run over these arrays
        self._undo = 0  # tokens of the last run, while undo() can take it back

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

    def run(self, ids: np.ndarray, last: int = 1) -> np.ndarray:
        """Feed ids [b, s] (s new tokens for every row); returns last-position logits [b, V],
        or those of the `last` positions [b, last, V] when last > 1."""
        s = ids.shape[1]
        self.reserve(int(self.count.max(initial=0)) + s)
        if not self._bindings:
            self._bind()
        binding = self._bindings[self._parity]
        for name, value in graph_feeds(self.graph.inputs, ids, self.count, {}, last=last).items():
            binding.bind_cpu_input(name, value)
        binding.bind_output("logits", "cpu")
        self.graph.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()
        self._swap()
        self.count = self.count + s
        self._undo = s
        return logits if last > 1 else logits[:, -1]

    def _swap(self) -> None:
        for i in self._spares:  # the fixed-size states were written into the spares
            self._states[i], self._spares[i] = self._spares[i], self._states[i]
        self._parity ^= 1

    def undo(self, keep: int = 0) -> None:
        """Back to the states before the last run (speculative decoding's rejected drafts):
        the fixed-size states it read are still in the spares, KV needs only the counts.
        `keep` > 0 keeps that many of the run's first tokens, which only a graph without
        fixed-size states can (their keys and values are in place; a recurrent state holds
        only the run's end)."""
        if not self._undo:
            raise ValueError("undo() follows a run() over the same arrays")
        if keep and self._spares:
            raise ValueError("undo(keep=) needs a graph without recurrent states")
        self._swap()
        self.count = self.count - self._undo + keep
        self._undo = 0

    def _bind(self) -> None:
        """Two IOBindings over the current arrays and spares of the fixed-size states: binding
        k reads set k and writes set 1 - k; a KV buffer is input and output of both."""
        import onnxruntime as ort

        session = self.graph.session
        self._spares = {
            i: np.empty_like(x) for i, (spec, x) in enumerate(zip(self.graph.pasts, self._states)) if not spec.is_kv
        }
        sets = [list(self._states), [self._spares.get(i, x) for i, x in enumerate(self._states)]]
        values = [[ort.OrtValue.ortvalue_from_numpy(x) for x in group] for group in sets]
        self._values = values  # the OrtValues alias the arrays; keep them alive with the bindings
        self._bindings = [session.io_binding(), session.io_binding()]
        for k, binding in enumerate(self._bindings):
            binding.bind_output("logits", "cpu")  # first: get_outputs() keeps the order of first binding
            for i, spec in enumerate(self.graph.pasts):
                binding.bind_ortvalue_input(spec.name, values[k][i])
                binding.bind_ortvalue_output(present_name(spec.name), values[k if spec.is_kv else 1 - k][i])
        self._parity = 0

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
        # Copies: the arrays are written in place by later calls.
        states = [np.array(_cut_kv(x[r : r + 1], spec, n)) for spec, x in zip(self.graph.pasts, self.states)]
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
