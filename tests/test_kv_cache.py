"""The KV cache of a bound state batch: one buffer per attention tensor, bound as both past and
present, written in place at each row's length and read only up to it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import hybridrt
from hybridrt.runtime.bound import BoundStepper
from hybridrt.runtime.model import Model

PROMPT = list(range(5, 29))


def _decode(model: Model, capacity: int, steps: int = 8) -> list[np.ndarray]:
    """Greedy logits of PROMPT's prefill and `steps` one-token calls on a fresh state batch."""
    stepper = model.stepper(1, capacity)
    logits = [stepper.forward(np.array([PROMPT])).copy()]
    for _ in range(steps):
        logits.append(stepper.forward(logits[-1].argmax(-1)[:, None]).copy())
    return logits


def test_decode_step_writes_kv_in_place(llama_onnx: Path) -> None:
    """A decode step writes one position of the bound buffers and nothing else: no copy of the
    cache into a new present, no regrowth (the buffers a step reads are the ones it wrote)."""
    model = hybridrt.load(llama_onnx)
    stepper = model.stepper(1, len(PROMPT) + 16)
    assert isinstance(stepper, BoundStepper) and stepper.on_host
    stepper.forward(np.array([PROMPT]))
    n = len(PROMPT)
    # On the CPU the bound OrtValues alias these arrays (runtime.bound).
    buffers = list(stepper._kv_host)
    before = [x.copy() for x in buffers]
    stepper.forward(np.array([[7]]))
    assert all(x is y for x, y in zip(stepper._kv_host, buffers))
    for old, new in zip(before, buffers):
        np.testing.assert_array_equal(new[:, :, :n], old[:, :, :n])
        assert np.abs(new[:, :, n]).max() > 0
        np.testing.assert_array_equal(new[:, :, n + 1 :], 0)


def test_capacity_is_not_read(llama_onnx: Path) -> None:
    """Logits do not depend on the buffers' capacity: attention reads each row's positions up
    to its length, never the padding after them (the same floats, not only close ones)."""
    model = hybridrt.load(llama_onnx)
    tight = _decode(model, len(PROMPT) + 8)
    padded = _decode(model, model.manifest.max_length)
    for a, b in zip(tight, padded):
        np.testing.assert_array_equal(a, b)
