"""Per-generation state: the graph's past/present tensors and how many tokens each row has seen.

Two ways to run a step, one interface (`forward(ids) -> last-position logits`):

- BoundStepper: buffers live on the session's device and are bound once with IO binding.
  KV buffers have a fixed capacity and are bound as both past and present: the graph writes
  the new keys and values in place (GroupQueryAttention's shared buffer), so KV is neither
  copied nor grown per step. Fixed-size states (conv/ssm) ping-pong between two sets
  allocated once, with two IOBindings prebound to the two directions. A decode step binds
  only input_ids, past_lengths and logit_positions; its logits land in one preallocated host
  buffer [b, 1, V]. On the CPU the buffers are numpy arrays the OrtValues alias, so rows can
  be read and written without a copy through the session. `reorder` (beam search) gathers
  rows in place there; on another device it runs a Gather graph from the states into spare
  buffers of the same shape, so states never cross to the host.
- PlainStepper: numpy feeds through session.run, for comparison and for debugging.

Rewinding (speculative decoding): `checkpoint()` marks the states after a call and
`rewind(mark)` returns to them. KV needs only the lengths set back (positions past a row's
length are never read, and the next call overwrites them). A BoundStepper built with
`ring=R` keeps its fixed states in R sets used in turn (call n reads set n mod R and writes
set n+1 mod R), so the states of any of the last R-1 calls are still on the device and a
rewind copies nothing: it only picks which prebound binding runs next.

Shapes: b = batch, s = new tokens this call, C = KV capacity, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import GenerationError
from ..graphs.contract import TensorSpec, present_name
from ..graphs.feeds import NUMPY_DTYPES, graph_feeds, state_shape, zero_states
from ..graphs.manifest import Manifest


@dataclass(frozen=True)
class Checkpoint:
    """Where a stepper stood after its `calls`-th call: what `rewind` returns to."""

    lengths: np.ndarray
    calls: int
    epoch: int  # reorders before it
    data: Any  # the stepper's own record of its states


class Stepper:
    """Runs the graph step by step over carried states; `lengths` [b] counts the tokens each
    row has seen (rows may differ: each is written and read at its own positions)."""

    ring: int | None = None  # how many calls back a checkpoint stays valid (None: any)

    def __init__(self, session: Any, manifest: Manifest, batch: int, capacity: int) -> None:
        self.session = session
        self.manifest = manifest
        self.batch = batch
        self.pasts = manifest.pasts
        self.vocab = int(manifest.vocab_size)
        self.has_kv = any(s.is_kv for s in self.pasts)
        self.capacity = min(max(int(capacity), 1), manifest.max_length) if self.has_kv else 0
        self.lengths = np.zeros(batch, dtype=np.int64)
        self.calls = 0
        # Whether any state is recurrent (conv, SSM): without one, forgetting tokens is only
        # setting the lengths back (their keys and values stay unread).
        self.recurrent = any(not s.is_kv for s in self.pasts)
        self.epoch = 0

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

    def _mark(self) -> Any:
        raise NotImplementedError

    def _restore(self, data: Any) -> None:
        raise NotImplementedError

    def grow(self, need: int) -> None:
        """Larger KV buffers (at least `need` positions, at most the model's max length),
        keeping what they hold: the capacity doubles, so a long conversation regrows rarely."""
        self.capacity = min(max(need, 2 * self.capacity), self.manifest.max_length)

    def states(self) -> list[np.ndarray]:
        """Host copies of the states, in the order of the pasts."""
        raise NotImplementedError

    def set_row(self, row: int, states: list[np.ndarray], length: int) -> None:
        """Row `row` takes `states` (one row each, KV of at most our capacity) and `length`."""
        raise NotImplementedError

    def fresh(self, batch: int) -> Stepper:
        """A stepper of the same kind and capacity over `batch` fresh rows."""
        raise NotImplementedError

    def reorder(self, index: np.ndarray) -> None:
        """Row r takes every state of row index[r] (KV, conv/ssm states and its length);
        index int64 [b], rows may repeat (beam search: each beam continues its origin).
        Checkpoints taken before cannot be rewound to after it."""
        self._reorder(np.asarray(index, dtype=np.int64))
        self.lengths = self.lengths[index]
        self.epoch += 1

    def _reorder(self, index: np.ndarray) -> None:
        raise NotImplementedError


def _fit(x: np.ndarray, spec: TensorSpec, capacity: int) -> np.ndarray:
    """A KV tensor cut or zero-padded to `capacity` positions (others unchanged)."""
    axis = spec.kv_axis
    if axis is None or x.shape[axis] == capacity:
        return x
    if x.shape[axis] > capacity:
        return np.take(x, np.arange(capacity), axis=axis)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, capacity - x.shape[axis])
    return np.pad(x, widths)


class PlainStepper(Stepper):
    """States as numpy arrays, fed and fetched with session.run each step."""

    def __init__(self, session: Any, manifest: Manifest, batch: int, capacity: int) -> None:
        super().__init__(session, manifest, batch, capacity)
        self._states = list(zero_states(self.pasts, batch, self.capacity).values())

    def forward(self, ids: np.ndarray, all_logits: bool = False, last: int = 1) -> np.ndarray:
        feeds = self._feeds(ids, all_logits, last)
        feeds.update((s.name, x) for s, x in zip(self.pasts, self._states))
        logits, *self._states = self.session.run(None, feeds)
        return logits if all_logits or last > 1 else logits[:, -1]

    # session.run returns new arrays, so a mark keeps references (set_row copies before writing).
    def _mark(self) -> Any:
        return list(self._states)

    def _restore(self, data: Any) -> None:
        self._states = [_fit(x, s, self.capacity) for s, x in zip(self.pasts, data)]

    def grow(self, need: int) -> None:
        super().grow(need)
        self._states = [_fit(x, s, self.capacity) for s, x in zip(self.pasts, self._states)]

    def states(self) -> list[np.ndarray]:
        return [x.copy() for x in self._states]

    def fresh(self, batch: int) -> Stepper:
        return PlainStepper(self.session, self.manifest, batch, self.capacity)

    def set_row(self, row: int, states: list[np.ndarray], length: int) -> None:
        self._states = [x.copy() for x in self._states]  # marks keep the old arrays
        for s, x, new in zip(self.pasts, self._states, states):
            x[row] = _fit(new, s, self.capacity)[0]
        self.lengths[row] = length

    def _reorder(self, index: np.ndarray) -> None:
        self._states = [x[index] for x in self._states]


class BoundStepper(Stepper):
    """States on the session's device, bound with IO binding (see the module docstring)."""

    def __init__(
        self,
        session: Any,
        manifest: Manifest,
        batch: int,
        capacity: int,
        device: tuple[str, int],
        ring: int = 2,
    ) -> None:
        super().__init__(session, manifest, batch, capacity)
        if ring < 2:
            raise ValueError(f"ring must be at least 2 (read one set, write another), got {ring}")
        self.device = device
        self.on_host = device[0] == "cpu"
        self.ring = self.sets = ring
        self.kv = [s for s in self.pasts if s.is_kv]
        self.fixed = [s for s in self.pasts if not s.is_kv]
        self.step_logits = np.empty((batch, 1, self.vocab), dtype=np.float32)
        self.current = 0  # the fixed-state set the next call reads
        self._gathers: dict[str, Any] = {}  # dtype -> the Gather session of `reorder` off the host
        self._allocate([self._zeros(s) for s in self.kv], [[self._zeros(s) for s in self.fixed]] * self.sets)

    def _zeros(self, spec: TensorSpec) -> np.ndarray:
        return np.zeros(state_shape(spec, self.batch, self.capacity), NUMPY_DTYPES[spec.dtype])

    def _value(self, x: np.ndarray) -> Any:
        """An OrtValue on the device: on the CPU it aliases x (which must stay alive)."""
        import onnxruntime as ort

        if self.on_host:
            return ort.OrtValue.ortvalue_from_numpy(x)
        return ort.OrtValue.ortvalue_from_numpy(x, *self.device)

    def _allocate(self, kv: list[np.ndarray], fixed: list[list[np.ndarray]]) -> None:
        """Buffers from host arrays (KV, and the `ring` sets of the fixed states), bound by `_bind`."""
        import onnxruntime as ort

        # On the CPU the arrays are the buffers; keep them (the OrtValues alias them).
        self._kv_host = [np.ascontiguousarray(x) for x in kv]
        self._fixed_host = [[np.array(x) for x in group] for group in fixed]
        self._kv_values = [self._value(x) for x in self._kv_host]
        self._fixed_values = [[self._value(x) for x in group] for group in self._fixed_host]
        self._kv_spare: list[Any] = []  # a second KV set for reorder off the host, made on first use
        self._step_value = ort.OrtValue.ortvalue_from_numpy(self.step_logits)
        self._bind()

    def _bind(self) -> None:
        """One prebound IOBinding per set of fixed states: binding k reads set k and writes set
        k + 1 mod ring; every binding reads and writes the KV buffers."""
        out_names = [o.name for o in self.session.get_outputs()]
        self.bindings = [self.session.io_binding() for _ in range(self.sets)]
        for k, binding in enumerate(self.bindings):
            # Bind every output once in graph order: get_outputs() keeps the order of first binding.
            written = self._fixed_values[(k + 1) % self.sets]
            outputs = {present_name(s.name): v for s, v in zip(self.fixed, written)}
            outputs.update((present_name(s.name), v) for s, v in zip(self.kv, self._kv_values))
            for name in out_names:
                if name in outputs:
                    binding.bind_ortvalue_output(name, outputs[name])
                else:
                    binding.bind_output(name, "cpu")  # logits: rebound per call
            for s, value in zip(self.fixed, self._fixed_values[k]):
                binding.bind_ortvalue_input(s.name, value)
            for s, value in zip(self.kv, self._kv_values):
                binding.bind_ortvalue_input(s.name, value)

    def forward(self, ids: np.ndarray, all_logits: bool = False, last: int = 1) -> np.ndarray:
        feeds = self._feeds(ids, all_logits, last)
        binding = self.bindings[self.current]
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        step = ids.shape[1] == 1 and not all_logits
        if step:
            binding.bind_ortvalue_output("logits", self._step_value)
        else:
            binding.bind_output("logits", "cpu")  # prefill: [b, n, V] on the host, once
        self.session.run_with_iobinding(binding)
        self.current = (self.current + 1) % self.sets
        if step:
            return self.step_logits[:, -1]
        logits = binding.get_outputs()[0].numpy()
        return logits if all_logits or last > 1 else logits[:, -1]

    def _mark(self) -> Any:
        return self.current

    def _restore(self, data: Any) -> None:
        self.current = data

    def _host(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(KV, current fixed set) as host arrays: the buffers themselves on the CPU."""
        if self.on_host:
            return self._kv_host, self._fixed_host[self.current]
        return [v.numpy() for v in self._kv_values], [v.numpy() for v in self._fixed_values[self.current]]

    def grow(self, need: int) -> None:
        super().grow(need)
        kv, _ = self._host()
        kv = [_fit(x, s, self.capacity) for s, x in zip(self.kv, kv)]
        # Every set moves (not only the current one), so checkpoints stay valid across a grow.
        if self.on_host:
            fixed = [[np.array(x) for x in group] for group in self._fixed_host]
        else:
            fixed = [[v.numpy() for v in group] for group in self._fixed_values]
        self._allocate(kv, fixed)

    def states(self) -> list[np.ndarray]:
        kv, fixed = self._host()
        by_name = {s.name: x for s, x in zip(self.kv, kv)} | {s.name: x for s, x in zip(self.fixed, fixed)}
        return [np.array(by_name[s.name]) for s in self.pasts]

    def fresh(self, batch: int) -> Stepper:
        return BoundStepper(self.session, self.manifest, batch, self.capacity, self.device, self.sets)

    def set_row(self, row: int, states: list[np.ndarray], length: int) -> None:
        new = {s.name: _fit(x, s, self.capacity)[0] for s, x in zip(self.pasts, states)}
        kv, fixed = self._host()
        for group, specs, values in (
            (kv, self.kv, self._kv_values),
            (fixed, self.fixed, self._fixed_values[self.current]),
        ):
            for s, x, value in zip(specs, group, values):
                x[row] = new[s.name]
                if not self.on_host:
                    value.update_inplace(x)
        self.lengths[row] = length

    def _reorder(self, index: np.ndarray) -> None:
        if self.on_host:
            for x in (*self._kv_host, *self._fixed_host[self.current]):
                x[...] = x[index]  # in place: the bound OrtValues alias these arrays
        else:
            # On the device: gather the current fixed set into the next one (as a step does),
            # and KV into a spare set that then takes the KV buffers' place.
            following = (self.current + 1) % self.sets
            for s, src, dst in zip(self.fixed, self._fixed_values[self.current], self._fixed_values[following]):
                self._gather(s, src, index, dst)
            self.current = following
            if self.kv:
                if not self._kv_spare:
                    self._kv_spare = [self._empty_like(s, v) for s, v in zip(self.kv, self._kv_values)]
                for s, src, dst in zip(self.kv, self._kv_values, self._kv_spare):
                    self._gather(s, src, index, dst)
                self._kv_values, self._kv_spare = self._kv_spare, self._kv_values
                self._bind()

    def _empty_like(self, spec: TensorSpec, value: Any) -> Any:
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_shape_and_type(value.shape(), NUMPY_DTYPES[spec.dtype], *self.device)

    def _gather(self, spec: TensorSpec, src: Any, index: np.ndarray, dst: Any) -> None:
        """dst[r] = src[index[r]] on the device, through a Gather session of src's dtype
        (built on first use, on the model session's providers)."""
        import onnxruntime as ort

        dtype = np.dtype(NUMPY_DTYPES[spec.dtype])
        if dtype.name not in self._gathers:
            providers = self.session.get_providers()
            options = self.session.get_provider_options()
            self._gathers[dtype.name] = ort.InferenceSession(
                _gather_model(dtype), providers=providers, provider_options=[options.get(p, {}) for p in providers]
            )
        session = self._gathers[dtype.name]
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", src)
        binding.bind_cpu_input("index", index)
        binding.bind_ortvalue_output("y", dst)
        session.run_with_iobinding(binding)


def _gather_model(dtype: np.dtype) -> bytes:
    """One Gather(axis=0) of `dtype`: x [n, ...] (any rank) and index int64 [b] -> y [b, ...]."""
    try:
        from onnx import TensorProto, helper
    except ImportError:
        raise GenerationError(
            "reordering states on a device (beam search) builds a one-node ONNX graph with the onnx "
            "package, which is not installed: pip install onnx"
        ) from None
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "index"], ["y"], axis=0)],
        "reorder",
        [
            helper.make_tensor_value_info("x", elem, None),
            helper.make_tensor_value_info("index", TensorProto.INT64, ["b"]),
        ],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # any onnxruntime this package supports loads IR 8 (onnx writes a newer one)
    return bytes(model.SerializeToString())


def new_stepper(
    session: Any,
    manifest: Manifest,
    batch: int,
    device: tuple[str, int],
    io_binding: bool,
    capacity: int,
    ring: int = 2,
) -> Stepper:
    """Fresh states for `batch` sequences: zero conv/ssm states, KV buffers of `capacity`
    positions (regrown when a call needs more), lengths 0. `ring`: how many sets of fixed
    states a bound stepper keeps, so that it can rewind ring - 1 calls."""
    if io_binding:
        return BoundStepper(session, manifest, batch, capacity, device, ring)
    return PlainStepper(session, manifest, batch, capacity)
