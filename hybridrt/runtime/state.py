"""Per-generation state: the graph's past/present tensors, the attention mask and positions.

Two ways to run a step, one interface (`forward(ids, mask) -> last-position logits`):

- BoundStepper: buffers live on the session's device and are bound with IO binding. Fixed-size
  states (Mamba conv/ssm) ping-pong between two sets allocated once; two IOBindings are
  prebound to the two directions, so a step only rebinds ids, mask, positions, KV and logits.
  KV presents stay on the device and are fed back as the next pasts (no host copy). Decode
  logits land in one preallocated host buffer [b, 1, V]; nothing else crosses to the host.
- PlainStepper: numpy feeds through session.run, for comparison and for debugging.

Shapes: b = batch, s = new tokens this call, L = tokens so far (past_len), V = vocabulary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GenerationError
from ..graphs.contract import TensorSpec, present_name
from ..graphs.feeds import NUMPY_DTYPES, graph_feeds, state_shape, zero_states
from ..graphs.manifest import Manifest


class Stepper:
    """Runs the graph step by step over its carried states; the mask bookkeeping is shared
    by both ways of running.

    `mask` [b, L] holds 1 for every token the states have seen and 0 for left padding;
    graphs.feeds derives the positions of new tokens from it.
    """

    def __init__(self, session: Any, manifest: Manifest, batch: int) -> None:
        self.session = session
        self.manifest = manifest
        self.batch = batch
        self.pasts = manifest.pasts
        self.vocab = int(manifest.vocab_size)
        self._mask = np.ones((batch, manifest.max_length), dtype=np.int64)
        self.length = 0

    @property
    def mask(self) -> np.ndarray:
        return self._mask[:, : self.length]

    def _inputs(self, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """Graph inputs but the pasts for ids [b, s] and their mask [b, s]; advances the bookkeeping."""
        s = ids.shape[1]
        if self.length + s > self._mask.shape[1]:
            raise GenerationError(f"{self.length + s} tokens exceed the model's max length {self._mask.shape[1]}")
        self._mask[:, self.length : self.length + s] = mask
        self.length += s
        return graph_feeds(self.manifest.inputs, ids, np.ascontiguousarray(self._mask[:, : self.length]), {})

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Run ids [b, s] (int64) with mask [b, s]; returns last-position logits [b, V].

        The returned array may be a view of a buffer that the next call overwrites.
        """
        raise NotImplementedError


class PlainStepper(Stepper):
    """States as numpy arrays, fed and fetched with session.run each step."""

    def __init__(self, session: Any, manifest: Manifest, batch: int) -> None:
        super().__init__(session, manifest, batch)
        self.states = list(zero_states(self.pasts, batch).values())

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = self._inputs(ids, mask)
        feeds.update((s.name, x) for s, x in zip(self.pasts, self.states))
        logits, *self.states = self.session.run(None, feeds)
        return logits[:, -1]


class BoundStepper(Stepper):
    """States on the session's device, bound with IO binding (see the module docstring)."""

    def __init__(self, session: Any, manifest: Manifest, batch: int, device: tuple[str, int]) -> None:
        import onnxruntime as ort

        super().__init__(session, manifest, batch)
        self.device = device
        self.fixed = [s for s in self.pasts if not s.grows]
        self.growing = [s for s in self.pasts if s.grows]
        out_names = [o.name for o in session.get_outputs()]
        self.kv_out = [out_names.index(present_name(s.name)) for s in self.growing]
        # Two sets for the fixed-size states: set 0 starts at zero, set 1 is written first.
        sets = [
            [ort.OrtValue.ortvalue_from_numpy(self._zeros(s), *device) for s in self.fixed],
            [
                ort.OrtValue.ortvalue_from_shape_and_type(state_shape(s, batch), NUMPY_DTYPES[s.dtype], *device)
                for s in self.fixed
            ],
        ]
        self.bindings = [session.io_binding(), session.io_binding()]
        for k, binding in enumerate(self.bindings):
            # Bind every output once in graph order: get_outputs() keeps the order of first binding.
            fixed = {present_name(s.name): v for s, v in zip(self.fixed, sets[1 - k])}
            for name in out_names:
                if name in fixed:
                    binding.bind_ortvalue_output(name, fixed[name])
                else:
                    binding.bind_output(name, *device)
            for s, value in zip(self.fixed, sets[k]):
                binding.bind_ortvalue_input(s.name, value)
        self.parity = 0
        self.kv = [ort.OrtValue.ortvalue_from_numpy(self._zeros(s), *device) for s in self.growing]
        self.step_logits = np.empty((batch, 1, self.vocab), dtype=np.float32)
        self._step_logits = ort.OrtValue.ortvalue_from_numpy(self.step_logits)

    def _zeros(self, spec: TensorSpec) -> np.ndarray:
        return np.zeros(state_shape(spec, self.batch), NUMPY_DTYPES[spec.dtype])

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        binding = self.bindings[self.parity]
        for name, value in self._inputs(ids, mask).items():
            binding.bind_cpu_input(name, value)
        for s, value in zip(self.growing, self.kv):
            binding.bind_ortvalue_input(s.name, value)
            binding.bind_output(present_name(s.name), *self.device)
        step = ids.shape[1] == 1
        if step:
            binding.bind_ortvalue_output("logits", self._step_logits)
        else:
            binding.bind_output("logits", "cpu")  # prefill: [b, s, V] on the host, once
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        self.kv = [outputs[i] for i in self.kv_out]
        self.parity ^= 1
        return self.step_logits[:, -1] if step else outputs[0].numpy()[:, -1]


def new_stepper(session: Any, manifest: Manifest, batch: int, device: tuple[str, int], io_binding: bool) -> Stepper:
    """Fresh states for `batch` sequences: zero conv/ssm states, KV of length 0."""
    if io_binding:
        return BoundStepper(session, manifest, batch, device)
    return PlainStepper(session, manifest, batch)
