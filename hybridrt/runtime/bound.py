"""BoundStepper: a state batch on the session's device, bound once with IO binding.

The one module that binds OrtValues to a session. KV buffers have a fixed capacity and are
bound as both past and present: the graph writes the new keys and values in place
(GroupQueryAttention's shared buffer), so KV is neither copied nor grown per step. Fixed-size
states (conv/ssm) are kept in `ring` sets allocated once, with one IOBinding prebound per set:
call n reads set n mod R and writes set n+1 mod R. A decode step binds only input_ids,
past_lengths and logit_positions; its logits land in one preallocated host buffer [b, 1, V].

With ring=1 (no rewinds, what generation and serving use) the states the manifest lists as
`in_place` (graphs/manifest.py, in_place_states: LinearAttention's and CausalConvWithState's) are, on the CPU,
one buffer that every set shares, bound as both past and present like KV: onnxruntime then
neither copies a state into a second buffer nor moves it through memory twice per step
(granite-h-350m: 22 MB of SSM state a token). The other fixed states alternate between two sets.

On the CPU the buffers are numpy arrays that the OrtValues alias, so rows are read and written
without a copy through the session; they have room for more rows than the batch holds (the
OrtValues alias the first `batch` rows), so a row that joins or leaves copies one row, not the
batch. On another device (CUDA) the states stay there for the whole generation: a step copies
only the ids in and the logits out; `reorder` with the batch size kept (beam search) runs a
Gather graph from the states into spare buffers of the same shape, and only rows that join,
leave or are copied out (`extend`, `reorder` to another size, `row`, `set_row`, `grow`) pass
through the host.

Rewinding copies nothing: the states of any of the last R-1 calls are still in the ring, and
a rewind only picks which prebound binding runs next. With `capture` (the loader's cuda_graph)
a decode step runs from fixed buffers as a captured CUDA graph (runtime/captured_step.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..graphs.compat import length_feeds
from ..graphs.contract import TensorSpec, present_name
from ..graphs.feeds import NUMPY_DTYPES, state_shape
from ..graphs.manifest import Manifest
from .captured_step import CapturedStep
from .device import Gathers, empty_like, run_options
from .state import StepOptions, Stepper, _fit, put_row, widened_kv

# KV dtypes that onnxruntime's CUDA GroupQueryAttention reads on the device (see BoundStepper).
DEVICE_KV_DTYPES = ("float16", "bfloat16")


class BoundStepper(Stepper):
    """States on the session's device, bound with IO binding (see the module docstring)."""

    def __init__(
        self, session: Any, manifest: Manifest, batch: int, capacity: int, options: StepOptions | None = None
    ) -> None:
        super().__init__(session, manifest, batch, capacity, options)
        o = self.options
        if o.ring < 1:
            raise ValueError(f"ring must be at least 1 (1: no rewinds, states in place), got {o.ring}")
        self.ring: int = o.ring
        self.capture, self.length_inputs, self.device = o.capture, o.length_inputs, o.device
        # the session of captured steps (another one over the one-token graph, or this one)
        self.step_session, self.step_inputs = o.decode or (session, o.length_inputs)
        self.on_host = self.device[0] == "cpu"
        self.kv = [s for s in self.pasts if s.is_kv]
        # onnxruntime's CUDA GroupQueryAttention (the fused graphs' attention) takes float16 and
        # bfloat16 only: a float32 (or int8) KV cache is attended by its CPU kernel, so its
        # buffers stay on the host, where the kernel writes them in place (measured on an H200:
        # with device buffers every family with attention diverged after the first token, the
        # kernel's writes not reaching the bound buffer). The other states stay on the device;
        # standard-operator attention (--plain-ops) runs on the device with its KV.
        gqa = bool(manifest.provenance.get("fused_ops", False))
        self.kv_on_host = self.on_host or (gqa and any(s.dtype not in DEVICE_KV_DTYPES for s in self.kv))
        self.sets = max(self.ring, 2)  # a state that is not in place is read from one set, written to another
        self.fixed = [s for s in self.pasts if not s.is_kv]
        self.current = 0  # the fixed-state set the next call reads
        self.reserved = batch  # rows the host buffers have room for (>= batch)
        self.floor = 0  # room kept however few rows are left (reserve)
        self._gathers = Gathers()  # the Gather sessions of `reorder` off the host
        kv, fixed = [self._shaped(s) for s in self.kv], [self._shaped(s) for s in self.fixed]
        self._allocate(kv, [fixed] * self.sets, zeros=True)

    def _shaped(self, spec: TensorSpec) -> np.ndarray:
        """A zero of the spec's shape at our batch and capacity, allocating nothing (a stride-0 view)."""
        zero = np.zeros((), NUMPY_DTYPES[spec.dtype])
        return np.broadcast_to(zero, state_shape(spec, self.batch, self.capacity))

    def _value(self, x: np.ndarray, host: bool = False) -> Any:
        """An OrtValue on the device: on the CPU (or `host`) it aliases x (which must stay alive)."""
        import onnxruntime as ort

        if self.on_host or host:
            return ort.OrtValue.ortvalue_from_numpy(x)
        return ort.OrtValue.ortvalue_from_numpy(x, *self.device)

    def _allocate(
        self, kv: list[np.ndarray], fixed: list[list[np.ndarray]], reserve: int = 0, zeros: bool = False
    ) -> None:
        """Buffers from host arrays of self.batch rows (KV, and the `ring` sets of the fixed
        states); on the host with room for `reserve` rows, so that rows join and leave in place.
        zeros: the arrays are all zeros, so nothing is copied (fresh np.zeros pages cost nothing
        until written: a new request's states are not written twice)."""
        self.reserved = max(reserve, self.batch) if self.on_host else self.batch

        def pool(x: np.ndarray) -> np.ndarray:
            buffer = np.zeros((self.reserved, *x.shape[1:]), x.dtype)
            if not zeros:
                buffer[: len(x)] = x
            return buffer

        # A state in place is one buffer that every set shares (bound as past and present): only
        # without rewinds, and on the CPU, whose kernels were measured reading and writing one
        # buffer (graphs.manifest.in_place_states).
        in_place = set(self.manifest.in_place) if self.ring == 1 and self.on_host else set()
        shared = [s.name in in_place for s in self.fixed]
        self._kv_pool = [pool(x) for x in kv]
        self._fixed_pool: list[list[np.ndarray]] = []
        for group in fixed:
            first = self._fixed_pool[0] if self._fixed_pool else None
            self._fixed_pool.append(
                [first[j] if first and one else pool(x) for j, (x, one) in enumerate(zip(group, shared))]
            )
        self._view()

    def _view(self) -> None:
        """Bind the first self.batch rows of the buffers (on the CPU the OrtValues alias them)."""
        import onnxruntime as ort

        b = self.batch
        self._kv_host = [x[:b] for x in self._kv_pool]
        self._fixed_host = [[x[:b] for x in group] for group in self._fixed_pool]
        self._kv_values = [self._value(x, self.kv_on_host) for x in self._kv_host]
        self._fixed_values: list[list[Any]] = []
        for k, group in enumerate(self._fixed_host):  # a shared buffer: one OrtValue, past and present
            pools = self._fixed_pool[k]
            self._fixed_values.append(
                [
                    self._fixed_values[0][j] if k and pools[j] is self._fixed_pool[0][j] else self._value(x)
                    for j, x in enumerate(group)
                ]
            )
        self._kv_spare: list[Any] = []  # a second KV set for reorder off the host, made on first use
        self.step_logits = np.empty((b, 1, self.vocab), dtype=np.float32)
        self._step_value = ort.OrtValue.ortvalue_from_numpy(self.step_logits)
        self._captured = (
            CapturedStep(self.step_session, self.device, self.step_logits, self._step_value) if self.capture else None
        )
        self._bind()

    def _bind(self) -> None:
        """One prebound IOBinding per set of fixed states: binding k reads set k and writes set
        k + 1 mod ring; every binding reads and writes the KV buffers. Captured steps run on
        bindings of their own session where it is another (an IOBinding belongs to one session)."""
        self.bindings = self._bindings(self.session)
        own = self.capture and self.step_session is not self.session
        self.step_bindings = self._bindings(self.step_session) if own else self.bindings
        if self._captured is not None:
            self._captured.bound.clear()  # new bindings: the captured step binds them again

    def _bindings(self, session: Any) -> list[Any]:
        out_names = [o.name for o in session.get_outputs()]
        bindings = [session.io_binding() for _ in range(self.sets)]
        for k, binding in enumerate(bindings):
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
        return bindings

    def forward(self, ids: np.ndarray, all_logits: bool = False, last: int = 1) -> np.ndarray:
        feeds = self._feeds(ids, all_logits, last)
        binding = self.bindings[self.current]
        step = ids.shape[1] == 1 and not all_logits
        if step and self._captured is not None:
            feeds |= length_feeds(self.step_inputs, self.lengths, 1, self.capacity)
            kv_buffers = id(self._kv_values[0]) if self._kv_values else 0
            logits = self._captured.run(self.step_bindings[self.current], self.current, kv_buffers, feeds)
            self.current = (self.current + 1) % self.sets
            return logits
        if self.length_inputs:  # as the graph computed them before the rewrite (total: the longest row)
            feeds |= length_feeds(self.length_inputs, self.lengths, ids.shape[1], int(self.lengths.max()))
        if self._captured is not None and self.step_bindings is self.bindings:
            self._captured.bound.discard(self.current)  # its inputs are these host arrays now
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        if step:
            binding.bind_ortvalue_output("logits", self._step_value)
        else:
            binding.bind_output("logits", "cpu")  # prefill: [b, n, V] on the host, once
        self.session.run_with_iobinding(binding, run_options(-1) if self.capture else None)
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

    def grow(self, need: int, keep: bool = True) -> None:
        super().grow(need, keep)
        if self.on_host:  # only KV depends on the capacity: the fixed states stay in their buffers
            rows = self.batch if keep else 0
            self._kv_pool = [widened_kv(x, s, rows, self.capacity) for s, x in zip(self.kv, self._kv_pool)]
            self._view()
            return
        kv = [_fit(v.numpy(), s, self.capacity) for s, v in zip(self.kv, self._kv_values)]
        # Every set moves (not only the current one), so checkpoints stay valid across a grow.
        self._allocate(kv, [[v.numpy() for v in group] for group in self._fixed_values], self.reserved)

    def _arrays(self) -> list[np.ndarray]:
        kv, fixed = self._host()
        by_name = {s.name: x for s, x in zip(self.kv, kv)} | {s.name: x for s, x in zip(self.fixed, fixed)}
        return [by_name[s.name] for s in self.pasts]

    def _replace(self, states: list[np.ndarray], reserve: int = 0) -> None:
        by_name = {s.name: x for s, x in zip(self.pasts, states)}
        self.current = 0
        fixed = [[by_name[s.name] for s in self.fixed]] * self.sets
        self._allocate([by_name[s.name] for s in self.kv], fixed, reserve)

    # Rows join and leave in place on the host: a leaving row costs a copy of the rows that
    # take its place, a joining one a copy of its own states, not a copy of the whole batch.
    # Only the current fixed set moves (checkpoints from before are refused, see `reorder`).

    def _select(self, index: np.ndarray) -> None:
        m = len(index)
        if not self.on_host or m > self.reserved:
            super()._select(index)
            return
        moved = np.flatnonzero(index != np.arange(m))
        if len(moved):
            source = index[moved]
            for x in (*self._kv_pool, *self._fixed_pool[self.current]):
                x[moved] = x[source]  # the source rows are read (copied) before any is written
        self.batch = m
        if 4 * m <= self.reserved and 2 * m >= self.floor:  # most of the room is idle: give it back
            pools = (*zip(self.kv, self._kv_pool), *zip(self.fixed, self._fixed_pool[self.current]))
            by_name = {s.name: x[:m] for s, x in pools}
            self._replace([by_name[s.name] for s in self.pasts], 2 * m)
        else:
            self._view()

    def reserve(self, rows: int) -> None:
        # On the CPU most of the room costs no memory until a row is written there: large
        # np.zeros buffers are mapped untouched (64 slots of a 32-layer model: +0.1-0.2 GB at one row).
        self.floor = rows
        if self.on_host and rows > self.reserved:
            self._allocate(self._kv_host, self._fixed_host, rows)  # every set moves: checkpoints stay valid

    def _append(self, rows: list[np.ndarray]) -> None:
        b, m = self.batch, self.batch + len(rows[0])
        if not self.on_host:
            super()._append(rows)
            return
        if m > self.reserved:  # room for twice as many: a growing batch regrows rarely
            self._replace(self._arrays(), max(m, 2 * self.reserved))
        by_name = {s.name: x for s, x in zip(self.pasts, rows)}
        for s, x in (*zip(self.kv, self._kv_pool), *zip(self.fixed, self._fixed_pool[self.current])):
            x[b:m] = by_name[s.name]
        self.batch = m
        self._view()

    def rewinding(self, calls: int) -> Stepper:
        if calls < self.ring:
            return self
        other = BoundStepper(
            self.session, self.manifest, self.batch, self.capacity, replace(self.options, ring=calls + 1)
        )
        other._replace(self._arrays(), self.reserved)  # copies: this stepper's buffers stay its own
        # A later epoch: marks of this stepper name its sets, not the other's, and are refused there.
        other.lengths, other.calls, other.epoch = self.lengths.copy(), self.calls, self.epoch + 1
        other.floor = self.floor
        return other

    def fresh(self, batch: int) -> Stepper:
        return BoundStepper(self.session, self.manifest, batch, self.capacity, self.options)

    def set_row(self, row: int, states: list[np.ndarray], length: int) -> None:
        new = {s.name: x for s, x in zip(self.pasts, states)}
        kv, fixed = self._host()
        for group, specs, values in (
            (kv, self.kv, self._kv_values),
            (fixed, self.fixed, self._fixed_values[self.current]),
        ):
            for s, x, value in zip(specs, group, values):
                put_row(x, row, new[s.name], s)  # in place: no padded copy of the row first
                if not self.on_host:
                    value.update_inplace(x)
        self.lengths[row] = length

    def _clear(self, row: int) -> None:
        if not self.on_host:
            super()._clear(row)
            return
        for x in self._host()[1]:  # KV: nothing (past_lengths masks it; see put_row)
            x[row] = 0

    def _reorder(self, index: np.ndarray) -> None:
        if self.on_host:
            for x in (*self._kv_host, *self._fixed_host[self.current]):
                x[...] = x[index]  # in place: the bound OrtValues alias these arrays
        else:
            # On the device: gather the current fixed set into the next one (as a step does),
            # and KV into a spare set that then takes the KV buffers' place.
            following = (self.current + 1) % self.sets
            for s, src, dst in zip(self.fixed, self._fixed_values[self.current], self._fixed_values[following]):
                self._gathers.run(self.session, NUMPY_DTYPES[s.dtype], src, index, dst)
            self.current = following
            if self.kv and self.kv_on_host:
                for x in self._kv_host:
                    x[...] = x[index]  # in place: the bound OrtValues alias these arrays
            elif self.kv:
                if not self._kv_spare:
                    self._kv_spare = [
                        empty_like(v, NUMPY_DTYPES[s.dtype], self.device) for s, v in zip(self.kv, self._kv_values)
                    ]
                for s, src, dst in zip(self.kv, self._kv_values, self._kv_spare):
                    self._gathers.run(self.session, NUMPY_DTYPES[s.dtype], src, index, dst)
                self._kv_values, self._kv_spare = self._kv_spare, self._kv_values
                self._bind()
