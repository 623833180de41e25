"""A state batch: the graph's past/present tensors for `b` rows, and how many tokens each row has seen.

This is the layer below `Model.generate` that the decode loop, beam search, speculative
decoding and the server engine share (`Model.stepper(batch, capacity)` makes one):

- `forward(ids)` runs the graph on ids [b, s] from the carried states and returns logits;
- rows join (`extend`), leave or are reordered and repeated (`reorder`, beam search), and a
  row is copied out (`row`) or written in (`set_row`), between calls;
- `checkpoint()` marks the states after a call and `rewind(mark)` returns to them
  (speculative decoding); KV buffers grow by doubling when a call needs more room.

Two implementations, one interface:

- BoundStepper (runtime.bound): buffers on the session's device, bound once with IO binding;
  KV written in place, fixed-size states in a ring of sets. The default.
- PlainStepper (runtime.plain): numpy feeds through session.run each call, for comparison and debugging.

Rewinding: KV needs only the lengths set back (positions past a row's length are never read, and the next
call overwrites them); the fixed-size (conv, SSM) states need their values from the mark, kept in a ring.

Shapes: b = batch, s = new tokens this call, C = KV capacity, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import GenerationError
from ..graphs.contract import TensorSpec
from ..graphs.feeds import graph_feeds
from ..graphs.manifest import Manifest
from .host_blocks import Blocks, block_bytes, new_block, pack
from .kv_pieces import Spans


@dataclass(frozen=True)
class Checkpoint:
    """Where a stepper stood after its `calls`-th call: what `rewind` returns to."""

    lengths: np.ndarray
    calls: int
    epoch: int  # reorders before it
    data: Any  # the stepper's own record of its states


@dataclass(frozen=True)
class Snapshot:
    """One row's states as host copies, its KV cut to the `length` positions it holds
    (the server's prefix cache keeps these; one made for it has its KV as views of the batch's
    buffers, of which StateCache.put copies what it keeps); `set_row` writes one into a state batch."""

    states: list[np.ndarray]
    length: int
    block: np.ndarray | None = field(default=None, repr=False, compare=False)  # holds the fixed states

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in self.states)


def narrowed(states: list[np.ndarray]) -> list[np.ndarray]:
    """float32 arrays as bfloat16 bits (uint16, rounded to nearest even), others as they are."""
    out = []
    for x in states:
        if x.dtype == np.float32:
            bits = np.ascontiguousarray(x).view(np.uint32)
            x = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        out.append(x)
    return out


def widened(states: list[np.ndarray]) -> list[np.ndarray]:
    """narrowed's inverse: bfloat16 bits (uint16) back to float32."""
    return [(x.astype(np.uint32) << 16).view(np.float32) if x.dtype == np.uint16 else x for x in states]


@dataclass(frozen=True)
class StepOptions:
    """How a state batch runs its session, fixed when it is made (Model.stepper) and passed on
    to the batches made from it (`fresh`, `rewinding`).

    device: where the states live (runtime.bound); ring: the sets of fixed-size states kept, so
    that a batch can rewind ring - 1 calls (1: no rewinds, states in place); capture: decode
    steps replayed as CUDA graphs, with attention's `length_inputs` as graph inputs
    (graphs/compat.py), or in `decode` (another session, its added inputs); batched_chunks:
    whether a call of several tokens after a past may hold several rows (not on onnxruntime
    1.31's GroupQueryAttention, where prefill runs such rows one at a time)."""

    device: tuple[str, int] = ("cpu", 0)
    ring: int = 1
    capture: bool = False
    length_inputs: tuple[str, ...] = ()
    batched_chunks: bool = True
    decode: tuple[Any, tuple[str, ...]] | None = None


class Stepper:
    """Runs the graph step by step over carried states; `lengths` [b] counts the tokens each
    row has seen (rows may differ: each is written and read at its own positions)."""

    ring: int | None = None  # how many calls back a checkpoint stays valid (None: any)

    def __init__(
        self, session: Any, manifest: Manifest, batch: int, capacity: int, options: StepOptions | None = None
    ) -> None:
        self.options = options or StepOptions()
        self.session, self.manifest, self.batch = session, manifest, batch
        self.pasts = manifest.pasts
        self.vocab = int(manifest.vocab_size)
        self.has_kv = any(s.is_kv for s in self.pasts)
        self.capacity = min(max(int(capacity), 1), manifest.max_length) if self.has_kv else 0
        self.lengths = np.zeros(batch, dtype=np.int64)
        self.calls, self.epoch = 0, 0
        # Without a recurrent state, forgetting tokens is only setting the lengths back (KV unread).
        self.recurrent = manifest.recurrent

    @property
    def batched_chunks(self) -> bool:
        return self.options.batched_chunks

    def _feeds(self, ids: np.ndarray, all_logits: bool, last: int = 1) -> dict[str, np.ndarray]:
        """Graph inputs but the pasts for ids [b, s]; checks and advances the lengths."""
        s = ids.shape[1]
        if not 1 <= last <= s:
            raise GenerationError(f"logits of the last {last} positions asked of a call of {s} tokens")
        need = int(self.lengths.max(initial=0)) + s
        if need > self.manifest.max_length:
            raise GenerationError(f"{need} tokens exceed the model's max length {self.manifest.max_length}")
        if self.has_kv and need > self.capacity:
            self.grow(need)
        feeds = graph_feeds(self.manifest.inputs, ids, self.lengths, {}, all_logits, last)
        self.lengths = self.lengths + s
        self.calls += 1
        return feeds

    def forward(self, ids: np.ndarray, all_logits: bool = False, last: int = 1) -> np.ndarray:
        """Run ids [b, s] (int64, s new tokens for every row); returns the last position's
        logits [b, V], those of the `last` positions [b, last, V] when last > 1, or every
        position's [b, s, V] with `all_logits`.

        The returned array may be a view of a buffer that the next call overwrites.
        """
        raise NotImplementedError

    def checkpoint(self) -> Checkpoint:
        """A mark of the current states (see the module docstring)."""
        return Checkpoint(self.lengths.copy(), self.calls, self.epoch, self._mark())

    def rewind(self, mark: Checkpoint, keep: int = 0) -> None:
        """Return to the states of `mark`; GenerationError when they have been overwritten
        (more than ring - 1 calls since), or when the mark is from a later call. `keep` > 0
        keeps that many tokens of the call after the mark, which only a stepper without
        recurrent states can (their keys and values are in place, unread past the lengths)."""
        if keep and self.recurrent:
            raise GenerationError("rewind(keep=) needs a model without recurrent (conv, SSM) states")
        if mark.epoch != self.epoch:
            raise GenerationError("cannot rewind to states from before a reorder: its rows are no longer those rows")
        since = self.calls - mark.calls
        if since < 0 or (self.ring is not None and since >= self.ring):
            raise GenerationError(
                f"cannot rewind {since} calls on a stepper that keeps {self.ring} sets of states; "
                f"build it with ring > {since}"
            )
        if keep:  # the call stays; only the tokens after its first `keep` are forgotten
            self.lengths = mark.lengths + keep
            return
        self._restore(mark.data)
        self.lengths = mark.lengths.copy()
        self.calls = mark.calls

    def rewinding(self, calls: int) -> Stepper:
        """This stepper if it can rewind `calls` calls, else one holding the same states that can."""
        return self

    def _mark(self) -> Any:
        raise NotImplementedError

    def _restore(self, data: Any) -> None:
        raise NotImplementedError

    def grow(self, need: int, keep: bool = True) -> None:
        """KV room for `need` positions, the capacity at least doubled (within max length); keep=False: no copy."""
        self.capacity = min(max(need, 2 * self.capacity), self.manifest.max_length)

    def states(self) -> list[np.ndarray]:
        """Host copies of the states, in the order of the pasts."""
        return [np.array(x) for x in self._arrays()]

    def _arrays(self) -> list[np.ndarray]:
        """The states as host arrays in the order of the pasts (views of the buffers where they
        are on the host: copy before the next call)."""
        raise NotImplementedError

    def set_row(self, row: int, states: list[np.ndarray], length: int) -> None:
        """Row `row` takes `states` (one row each, KV of at most our capacity) and `length`."""
        raise NotImplementedError

    def row(self, r: int, blocks: Blocks | None = None) -> Snapshot:
        """Row r's states and length, its KV cut to the positions it holds."""
        return self.row_at(r, int(self.lengths[r]), None, blocks)

    def fixed_of(self, r: int, into: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Row r's fixed-size (conv, SSM) states copied into `into` (made when None, reusable:
        the next call writes the row's states in place, its KV at later positions only)."""
        rows = [x[r : r + 1] for s, x in zip(self.pasts, self._arrays()) if not s.is_kv]
        if into is None:
            return pack(rows, new_block(block_bytes(rows)))
        for dst, x in zip(into, rows):
            dst[...] = x
        return into

    def row_at(
        self, r: int, length: int, fixed: list[np.ndarray] | None = None, blocks: Blocks | None = None
    ) -> Snapshot:
        """Row r's states (copies) with its KV cut to `length` positions; with `fixed`, the fixed
        states it had then (fixed_of), its KV having been written at later positions only since.
        The fixed states are copied into one block (runtime.host_blocks), from `blocks` if given:
        a cache's, for its put, which copies of the KV only what it keeps (the positions past what
        it holds), so the KV is then views of the buffers, valid until the next call."""
        arrays, copy = self._arrays(), np.array if blocks is None else np.asarray
        rows = [x[r : r + 1] for s, x in zip(self.pasts, arrays) if not s.is_kv] if fixed is None else fixed
        block = (new_block if blocks is None else blocks.take)(block_bytes(rows)) if rows else None
        held = iter([] if block is None else pack(rows, block))
        states = [copy(_fit(x[r : r + 1], s, length)) if s.is_kv else next(held) for s, x in zip(self.pasts, arrays)]
        return Snapshot(states, length, block)

    def fresh(self, batch: int) -> Stepper:
        """A stepper of the same kind and capacity over `batch` fresh rows."""
        raise NotImplementedError

    def restart(self, row: Snapshot | None, capacity: int) -> None:
        """One row again, holding `row` (None: fresh states), KV room for at least `capacity`
        positions: a server's idle decode batch takes its next request in the buffers it has
        instead of new ones. Checkpoints taken before cannot be rewound to after it. Too small,
        they grow to twice `capacity` (kept batches take a conversation's turns in turn; a grow
        costs page faults as the row is written to new memory: 10-40 ms a granite-h-350m turn)."""
        if self.batch > 1:
            self.reorder([0])
        if self.has_kv and capacity > self.capacity:
            self.grow(2 * capacity, keep=False)
        if row is None:
            self._clear(0)
            self.lengths[0] = 0
        else:
            self.set_row(0, row.states, row.length)
        self.epoch += 1

    def _clear(self, row: int) -> None:
        """Fresh (zero) states in row `row`."""
        self.set_row(row, [np.zeros_like(x[row : row + 1]) for x in self._arrays()], 0)

    def reorder(self, index: np.ndarray | list[int]) -> None:
        """Row r takes every state of row index[r] (KV, conv/ssm states and its length): rows
        leave (an index shorter than the batch), change places or repeat (beam search: each
        beam continues its origin). Checkpoints taken before cannot be rewound to after it."""
        index = np.asarray(index, dtype=np.int64)
        if not len(index):
            raise ValueError("reorder needs at least one row")
        if index.min() < 0 or index.max() >= self.batch:
            raise ValueError(f"reorder's rows must be in 0..{self.batch - 1}, got {index.tolist()}")
        if len(index) == self.batch:
            self._reorder(index)
        else:
            self._select(index)
        self.lengths = self.lengths[index]
        self.epoch += 1

    def extend(self, other: Stepper) -> None:
        """Append other's rows after ours, KV buffers holding at least the larger of the two
        capacities (other is left as it was). Checkpoints taken before cannot be rewound to after it."""
        if other.capacity > self.capacity:
            self.grow(other.capacity)
        self._append([_fit(x, s, self.capacity) for s, x in zip(self.pasts, other._arrays())])
        self.lengths = np.concatenate([self.lengths, other.lengths])
        self.epoch += 1

    def append_row(self, row: Snapshot, capacity: int = 0) -> None:
        """Append one row from a snapshot after ours, as extend does with another stepper's rows,
        KV buffers holding at least `capacity` positions (a server's request joining its batch
        from cached states, without states of its own)."""
        if max(capacity, row.length) > self.capacity:
            self.grow(max(capacity, row.length))
        self._append([_fit(x, s, self.capacity) for s, x in zip(self.pasts, row.states)])
        self.lengths = np.concatenate([self.lengths, [row.length]])
        self.epoch += 1

    def reserve(self, rows: int) -> None:
        """Keep room for `rows` rows (a server's slots), so that rows joining later are written
        into it instead of the batch being reallocated. A stepper without such room ignores it."""

    def _reorder(self, index: np.ndarray) -> None:
        """reorder() keeping the batch size."""
        raise NotImplementedError

    def _select(self, index: np.ndarray) -> None:
        """reorder() to another batch size: the rows `index` of the states, in that order."""
        states = [x[index] for x in self._arrays()]
        self.batch = len(index)
        self._replace(states)

    def _append(self, rows: list[np.ndarray]) -> None:
        """extend(): `rows` (states of other rows at our KV capacity) after ours."""
        states = [np.concatenate([a, b]) for a, b in zip(self._arrays(), rows)]
        self.batch += len(rows[0])
        self._replace(states)

    def _replace(self, states: list[np.ndarray]) -> None:
        """New buffers holding `states` (host arrays of self.batch rows and self.capacity
        KV positions, in the order of the pasts)."""
        raise NotImplementedError


def put_row(x: np.ndarray, row: int, src: np.ndarray, spec: TensorSpec) -> None:
    """x[row] = src[0] in place, src's KV cut to x's positions; positions past src's keep what
    they held (past_lengths masks them, as after a rewind; zeros would fault new pages in)."""
    axis = spec.kv_axis
    if axis is None:
        x[row] = src[0]
    elif isinstance(src, Spans):  # a lookup's KV of several pieces: each copied in, none joined
        src.into(x[row], min(src.shape[axis], x.shape[axis]))
    else:
        n, lead = min(src.shape[axis], x.shape[axis]), (slice(None),) * (axis - 1)  # lead: axes before KV's positions
        x[row][lead + (slice(0, n),)] = src[0][lead + (slice(0, n),)]


def widened_kv(x: np.ndarray, spec: TensorSpec, rows: int, capacity: int) -> np.ndarray:
    """A new KV buffer with x's room for rows and `capacity` positions, holding x's first `rows`
    rows (the others are zeros, as unused room is)."""
    axis = spec.kv_axis
    assert axis is not None
    new = np.zeros((*x.shape[:axis], capacity, *x.shape[axis + 1 :]), x.dtype)
    held = (slice(0, rows),) + (slice(None),) * (axis - 1) + (slice(0, min(x.shape[axis], capacity)),)
    new[held] = x[held]
    return new


def _fit(x: np.ndarray, spec: TensorSpec, capacity: int) -> np.ndarray:
    """A KV tensor cut or zero-padded to `capacity` positions (others unchanged)."""
    axis = spec.kv_axis
    if axis is None or x.shape[axis] == capacity:
        return x
    if x.shape[axis] > capacity:  # a view: callers copy it once, if at all
        return x[(slice(None),) * axis + (slice(0, capacity),)]
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, capacity - x.shape[axis])
    return np.pad(x, widths)
