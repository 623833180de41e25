"""KV shared between the prefix state cache's entries along one path (runtime.prefix_cache).

The entries on one conversation's path (checkpoints inside prompts, each prompt's tail and end,
each reply's end) each need the KV of their whole prefix: a copy each would hold a 4,000-token
conversation's first positions some thirty times over, where attention-heavy models keep far
more KV than fixed-size states (Qwen3.5-0.8B: ~24.6 KB of float32 KV a token against ~19 MB of
conv and recurrent states). So an entry's KV is a list of pieces, one per span of positions: the spans before its
own are the very pieces (the same arrays) its nearest ancestor in memory holds, and only the
positions past that ancestor are a copy of its own (`pieces_for`). An ancestor on disk only
shares nothing: the entry copies from the nearest one in memory, or all of its KV.

A piece lives while any entry holds it and is counted in the cache's memory once. An entry
leaving memory frees its fixed states, its logits and the pieces no other entry holds
(`release`); that, not its whole size, is what it is valued by (Entry.unshared). An ancestor may
leave while its descendants still hold its pieces: they stay, counted, until the last holder
leaves. Entries that part below a shared prefix (two conversations after one system prompt)
hold its pieces alike. What it saves: benchmarks/bench_kv_sharing.py.

A lookup reads an entry's pieces as they are (`Spans`), which a state batch's row takes span
by span: no joined copy of the KV on a resumed request's way to its first token.

KV that another call computed (another chunking, a decode step) agrees with a cold prefill's
to rounding, as a stored KV already did: a request resumed from shared pieces gets a cold
request's tokens, its logits within the same tolerance.

Shapes: each KV array is one row of a graph past, positions on the spec's kv_axis; a piece's
arrays hold positions start..end, one per KV past in the order of the pasts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from ..graphs.contract import TensorSpec


@dataclass(eq=False)
class Piece:
    arrays: list[np.ndarray]  # one per KV past: positions start..end
    start: int
    end: int
    holders: set[Any] = field(default_factory=set)  # the entries (Holder) whose KV it is part of
    nbytes: int = 0

    def __post_init__(self) -> None:
        self.nbytes = sum(a.nbytes for a in self.arrays)


class Holder(Protocol):
    """What holds pieces: a cache entry (runtime.cache_entry.Entry), its KV and its length."""

    kv: list[Piece]

    @property
    def length(self) -> int: ...


H = TypeVar("H", bound=Holder)


def span(x: np.ndarray, spec: TensorSpec, start: int, end: int) -> np.ndarray:
    """A view of x's positions start..end (x a KV array)."""
    axis = spec.kv_axis
    assert axis is not None
    return x[(slice(None),) * axis + (slice(start, end),)]


def split(pasts: Sequence[TensorSpec], states: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A row's states (in the order of the pasts) as its fixed-size states and its KV arrays."""
    fixed = [x for s, x in zip(pasts, states) if not s.is_kv]
    kv = [x for s, x in zip(pasts, states) if s.is_kv]
    return fixed, kv


def merged(pasts: Sequence[TensorSpec], fixed: Sequence[np.ndarray], kv: Sequence[np.ndarray]) -> list[np.ndarray]:
    """split's inverse: the states in the order of the pasts."""
    fixed_it, kv_it = iter(fixed), iter(kv)
    return [next(kv_it) if s.is_kv else next(fixed_it) for s in pasts]


def pieces_for(
    kv: Sequence[np.ndarray], specs: Sequence[TensorSpec], length: int, base: Holder | None, owned: bool = True
) -> tuple[list[Piece], Piece | None]:
    """The pieces of a KV of `length` positions (kv: one array per KV past, at least that many
    positions): those of `base` (an entry in memory whose tokens start ours, or None), then a
    new piece of the positions past it, None when there are none. The new piece holds the
    arrays themselves where they are exactly the KV (nothing shared) and `owned` (the caller's
    to give away, not views of a state batch's buffers), else copies."""
    shared = [] if base is None else list(base.kv)
    start = 0 if base is None else base.length
    if start >= length or not specs:
        return shared, None
    own = []
    for spec, x in zip(specs, kv):
        axis = spec.kv_axis
        assert axis is not None
        exact = owned and start == 0 and x.shape[axis] == length
        own.append(x if exact else np.array(span(x, spec, start, length)))
    piece = Piece(own, start, length)
    return [*shared, piece], piece


def hold(entry: H, pieces: list[Piece]) -> list[H]:
    """entry's KV is `pieces`; returns the entries that held one of them alone before (leaving,
    they now free less)."""
    before: list[H] = []
    for piece in pieces:
        if len(piece.holders) == 1:
            before.extend(piece.holders)
        piece.holders.add(entry)
    entry.kv = pieces
    return before


def release(entry: H) -> tuple[int, list[H]]:
    """entry lets its pieces go: the bytes of those no other entry holds (freed), and the
    entries that now hold one alone (leaving, they now free more)."""
    freed = 0
    alone: list[H] = []
    for piece in entry.kv:
        piece.holders.discard(entry)
        if not piece.holders:
            freed += piece.nbytes
        elif len(piece.holders) == 1:
            alone.extend(piece.holders)
    entry.kv = []
    return freed, alone


def joined(pieces: Sequence[Piece], specs: Sequence[TensorSpec], length: int, spans: bool = False) -> list[Any]:
    """The KV of positions 0..length held by `pieces` (one per KV past): a piece's own arrays (or
    views of them) where one piece holds those positions, else a new array, or with `spans` the
    pieces' views as they are (Spans: a lookup's, which a state batch copies straight in)."""
    used = [p for p in pieces if p.start < length]
    out: list[Any] = []
    for i, spec in enumerate(specs):
        parts = [span(p.arrays[i], spec, 0, min(p.end, length) - p.start) for p in used]
        if len(parts) == 1:
            out.append(parts[0])
        else:
            axis = spec.kv_axis
            assert axis is not None
            out.append(Spans(parts, axis) if spans else np.concatenate(parts, axis=axis))
    return out


class Spans:
    """One KV array as the views of its pieces' spans of positions, in order. `into` copies them
    into a state batch's row (runtime.state.put_row), with no joined copy made first: at 7,000
    positions of granite-h-350m the join took 6-12 ms on a resumed turn's way to its first token.
    Read any other way (an index, np.asarray, a method), it is the joined array, made once."""

    def __init__(self, parts: list[np.ndarray], axis: int) -> None:
        self.parts, self.axis = parts, axis
        self._joined: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.parts[0].shape
        return (*first[: self.axis], sum(p.shape[self.axis] for p in self.parts), *first[self.axis + 1 :])

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def joined(self) -> np.ndarray:
        if self._joined is None:
            self._joined = np.concatenate(self.parts, axis=self.axis)
        return self._joined

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        x = self.joined() if dtype is None else self.joined().astype(dtype)
        return x.copy() if copy and x is self._joined else x  # (a copy asked for is not the one kept)

    def __getitem__(self, key: Any) -> Any:
        return self.joined()[key]

    def __getattr__(self, name: str) -> Any:
        # Whatever else a lookup's states meet reads them as arrays (Stepper.append_row pads a
        # whole-prompt hit to the batch's capacity, widened casts bfloat16 bits).
        if name.startswith("_"):  # (unpickling asks before __init__ has run)
            raise AttributeError(name)
        return getattr(self.joined(), name)

    def into(self, row: np.ndarray, n: int) -> None:
        """row[positions 0..n] = our first n positions (row: one row of a KV buffer)."""
        lead, at = (slice(None),) * (self.axis - 1), 0
        for part in self.parts:
            k = min(part.shape[self.axis], n - at)
            if k <= 0:
                return
            row[lead + (slice(at, at + k),)] = part[0][lead + (slice(0, k),)]
            at += k
