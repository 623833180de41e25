"""The runtime's state batch (Model.stepper): rows join, leave, are copied out and written in,
and calls are taken back, each row continuing exactly as it would alone. The server engine,
beam search and speculative decoding all run on it.

"device": BoundStepper's path for states off the host (OrtValues it never reads as numpy
arrays between calls), which runs on the CPU as well when the stepper does not treat its
buffers as host arrays; on a GPU it is the path every call takes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hybridrt
from hybridrt.errors import GenerationError
from hybridrt.runtime.bound import BoundStepper
from hybridrt.runtime.decode import prefill
from hybridrt.runtime.plain import PlainStepper
from hybridrt.runtime.sampling import GenerationConfig
from hybridrt.runtime.state import StepOptions, Stepper
from hybridrt.serve.engine import Engine, EngineConfig, Request, Update

KINDS = ["plain", "host", "device"]


def stepper_of(model: Any, kind: str, batch: int, capacity: int, ring: int = 1) -> Stepper:
    """A state batch of one of KINDS (ring 1: no rewinds, states in place where the graph allows)."""
    args = (model.inference_session, model.manifest, batch, capacity)
    if kind == "plain":
        return PlainStepper(*args)
    stepper = BoundStepper(*args, StepOptions(model.device, ring))
    if kind == "device":  # the device path on the CPU: two sets of every state, none shared
        stepper.on_host = False
        stepper._replace(stepper._arrays())
    return stepper


def _prompt(n: int, start: int = 3) -> list[int]:
    return [(start + 7 * i) % 97 + 3 for i in range(n)]


def _steps(stepper: Stepper, tokens: list[int], n: int) -> list[np.ndarray]:
    """Logits of n decode steps, each row fed its own token + step."""
    out = []
    for step in range(n):
        ids = np.asarray([[t + step] for t in tokens], dtype=np.int64)
        out.append(stepper.forward(ids).copy())
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_rows_join_and_leave_as_if_alone(jamba_onnx: Path, kind: str) -> None:
    """Two sequences prefilled apart (different capacities), joined into one batch, then one
    leaves: every row's logits equal those of its sequence run alone, across a KV regrowth."""
    model = hybridrt.load(jamba_onnx)
    a, b = _prompt(5), _prompt(9, start=11)
    alone_a, alone_b = stepper_of(model, kind, 1, 6), stepper_of(model, kind, 1, 16)
    prefill(alone_a, [a])
    prefill(alone_b, [b])
    want_a, want_b = _steps(alone_a, [40], 6), _steps(alone_b, [50], 6)

    batch, other = stepper_of(model, kind, 1, 6), stepper_of(model, kind, 1, 16)
    prefill(batch, [a])
    prefill(other, [b])
    batch.extend(other)
    assert batch.batch == 2 and batch.lengths.tolist() == [5, 9] and batch.capacity == 16
    got = _steps(batch, [40, 50], 3)
    for step in range(3):
        np.testing.assert_allclose(got[step][0], want_a[step][0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(got[step][1], want_b[step][0], rtol=0, atol=1e-5)
    batch.reorder([1])  # the first sequence leaves
    assert batch.batch == 1 and batch.lengths.tolist() == [12]
    for step, logits in enumerate(_steps(batch, [53], 3)):
        np.testing.assert_allclose(logits[0], want_b[step + 3][0], rtol=0, atol=1e-5)


def test_rows_join_and_leave_in_place(jamba_onnx: Path) -> None:
    """On the host a joining row copies only its own states into room the batch keeps, and a
    leaving row only the row that takes its place: the buffers stay. (Every join and leave
    used to copy the whole batch: at 64 server slots of a 32-layer model, gigabytes each.)
    Every row still continues as it would alone, and a batch that shrinks to a quarter of its
    room gives the rest back."""
    model = hybridrt.load(jamba_onnx)
    prompts = [_prompt(n, start=n) for n in (3, 5, 7, 4, 6)]
    want = []
    for i, p in enumerate(prompts):
        alone = stepper_of(model, "host", 1, 16)
        prefill(alone, [p])
        want.append(_steps(alone, [40 + i], 3))
    rows = []
    for p in prompts:
        rows.append(stepper_of(model, "host", 1, 16))
        prefill(rows[-1], [p])
    batch = rows[0]
    for other in rows[1:]:
        batch.extend(other)
    assert isinstance(batch, BoundStepper) and batch.batch == 5 and batch.reserved == 8
    buffers = [x.ctypes.data for x in (*batch._kv_pool, *sum(batch._fixed_pool, []))]
    first = _steps(batch, [40 + i for i in range(5)], 1)[0]
    for i in range(5):
        np.testing.assert_allclose(first[i], want[i][0][0], rtol=0, atol=1e-5)
    index = [0, 4, 2, 3]  # row 1 leaves, the last row takes its place
    batch.reorder(index)
    assert batch.batch == 4 and batch.reserved == 8
    assert [x.ctypes.data for x in (*batch._kv_pool, *sum(batch._fixed_pool, []))] == buffers
    for step, logits in enumerate(_steps(batch, [41 + i for i in index], 2)):
        for r, i in enumerate(index):
            np.testing.assert_allclose(logits[r], want[i][step + 1][0], rtol=0, atol=1e-5)
    batch.reorder([2])
    assert batch.batch == 1 and batch.reserved == 2
    logits = batch.forward(np.asarray([[99]]))
    alone = stepper_of(model, "host", 1, 16)
    prefill(alone, [prompts[2]])
    for t in (42, 43, 44):
        alone.forward(np.asarray([[t]]))
    np.testing.assert_allclose(logits[0], alone.forward(np.asarray([[99]]))[0], rtol=0, atol=1e-5)


def test_reserved_room_takes_rows_without_reallocating(jamba_onnx: Path) -> None:
    """reserve(n) (the server's slots): rows join into that room and leave it with the buffers
    in place, and the room stays when the batch empties to one row."""
    model = hybridrt.load(jamba_onnx)
    batch = stepper_of(model, "host", 1, 16, ring=2)
    prefill(batch, [_prompt(5)])
    assert isinstance(batch, BoundStepper)

    def buffers() -> list[int]:
        return [x.ctypes.data for x in (*batch._kv_pool, *sum(batch._fixed_pool, []))]

    mark = batch.checkpoint()
    first = batch.forward(np.asarray([[9]])).copy()
    batch.reserve(4)  # room made after a checkpoint: the rewind still finds its states
    assert batch.reserved == 4
    batch.rewind(mark)
    np.testing.assert_allclose(batch.forward(np.asarray([[9]])), first, rtol=0, atol=1e-6)
    before = buffers()
    for n in (3, 8, 6):
        other = stepper_of(model, "host", 1, 16)
        prefill(other, [_prompt(n, start=n)])
        batch.extend(other)
    assert batch.batch == 4 and batch.reserved == 4 and buffers() == before
    with pytest.raises(ValueError, match="0..3"):
        batch.reorder([-1, 0])  # not a row: refused before anything moves
    batch.reorder([3])
    assert batch.batch == 1 and batch.reserved == 4 and buffers() == before
    alone = stepper_of(model, "host", 1, 16)
    prefill(alone, [_prompt(6, start=6)])
    np.testing.assert_allclose(batch.forward(np.asarray([[7]])), alone.forward(np.asarray([[7]])), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_copied_out_continues_in_another_batch(jamba_onnx: Path, kind: str) -> None:
    """row(r) -> set_row: the prefix cache's round trip; KV cut to the row's length, then
    padded to the new batch's capacity."""
    model = hybridrt.load(jamba_onnx)
    source = stepper_of(model, kind, 2, 32)
    prefill(source, [_prompt(7), _prompt(4)])
    snapshot = source.row(1)
    assert snapshot.length == 4 and snapshot.nbytes > 0
    target = stepper_of(model, kind, 3, 20)
    target.set_row(2, snapshot.states, snapshot.length)
    assert target.lengths.tolist() == [0, 0, 4]
    want = _steps(source, [60, 61], 2)
    got = _steps(target, [1, 2, 61], 2)
    for step in range(2):
        np.testing.assert_allclose(got[step][2], want[step][1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_rewind_takes_back_the_last_call(jamba_onnx: Path, kind: str) -> None:
    model = hybridrt.load(jamba_onnx)
    stepper = stepper_of(model, kind, 1, 4, ring=2)
    stepper.forward(np.asarray([[5, 17, 99]]))
    mark = stepper.checkpoint()
    before = stepper.forward(np.asarray([[4]])).copy()
    stepper.rewind(mark)
    assert stepper.lengths.tolist() == [3]
    logits = stepper.forward(np.asarray([[4, 9, 2]]), last=3)
    assert logits.shape == (1, 3, model.manifest.vocab_size)
    np.testing.assert_allclose(logits[0, 0], before[0], atol=1e-5)  # the states were as before the call
    with pytest.raises(GenerationError, match="recurrent"):
        stepper.rewind(mark, keep=1)  # a recurrent state holds only the call's end
    stepper.reorder([0])  # a new epoch: the rows may no longer be those rows
    with pytest.raises(GenerationError, match="reorder"):
        stepper.rewind(mark)


def test_engine_keeps_states_off_the_host_between_steps(jamba_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server engine on the device path (as with --provider cuda): greedy tokens equal
    Model.generate under concurrency, and states pass through the host only when rows join or
    leave, never per step."""
    model = hybridrt.load(jamba_onnx)
    prompts = [_prompt(n, start=n) for n in (4, 9, 6)]
    want = [model.generate(p, max_new_tokens=12, eos_token_id=[]) for p in prompts]
    init, host = BoundStepper.__init__, BoundStepper._host
    copies = []

    def off_host(self: BoundStepper, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.on_host = False

    def counted(self: BoundStepper) -> Any:
        copies.append(self.batch)
        return host(self)

    monkeypatch.setattr(BoundStepper, "__init__", off_host)
    monkeypatch.setattr(BoundStepper, "_host", counted)
    engine = Engine(model, EngineConfig(slots=3, chunk=4, cache_bytes=0)).start()
    assert engine.ready.wait(60)
    results: list[list[Update]] = [[] for _ in prompts]
    try:
        for p, out in zip(prompts, results):
            engine.submit(Request(p, GenerationConfig(max_new_tokens=12, eos_token_id=[]), out.append))
        deadline = time.monotonic() + 60
        while not all(out and out[-1].finish_reason for out in results):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        engine.stop()
    got = [[t for u in out for t in u.tokens] for out in results]
    assert got == want
    # Each join copies both sides once and each leave the batch once: far fewer than the 33 steps.
    assert len(copies) <= 3 * len(prompts)


def test_float32_kv_stays_on_the_host_beside_states_on_the_device(
    jamba_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime's CUDA GroupQueryAttention has no float32 kernel, so a fused graph's float32
    KV cache is attended on the CPU: with a CUDA device its buffers are host OrtValues (written in place by
    the CPU kernel) while the conv and SSM states are device OrtValues. Here the device's
    OrtValues are made on the CPU (no GPU), with the device each was asked for recorded; on a
    GPU the same stepper gave greedy tokens equal to transformers for all 19 families
    (docs/gpu.md), where device KV buffers had diverged after the first token."""
    import onnxruntime as ort

    model = hybridrt.load(jamba_onnx)
    made: list[tuple[tuple[int, ...], str]] = []
    from_numpy = ort.OrtValue.ortvalue_from_numpy

    def recorded(x: np.ndarray, device: str = "cpu", *rest: Any) -> Any:
        made.append((x.shape, device))
        return from_numpy(x)

    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", staticmethod(recorded))
    stepper = BoundStepper(model.inference_session, model.manifest, 1, 64, StepOptions(("cuda", 0)))
    assert stepper.kv_on_host and not stepper.on_host
    kv_shapes = {tuple(v.shape()) for v in stepper._kv_values}
    fixed_shapes = {tuple(v.shape()) for group in stepper._fixed_values for v in group}
    assert {d for s, d in made if s in kv_shapes} == {"cpu"}
    assert {d for s, d in made if s in fixed_shapes} == {"cuda"}
    # Standard-operator attention (--plain-ops) runs on the device: its KV stays there.
    import copy

    standard = copy.deepcopy(model.manifest)
    standard.provenance["fused_ops"] = False
    assert not BoundStepper(model.inference_session, standard, 1, 64, StepOptions(("cuda", 0))).kv_on_host
    plain = model.stepper(1, 64)
    prompt = np.asarray([_prompt(9)], dtype=np.int64)
    assert np.allclose(plain.forward(prompt), stepper.forward(prompt), atol=1e-5)
    want, got = _steps(plain, [7], 5), _steps(stepper, [7], 5)
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(want, got))
    # Beam search's reorder: the device states through the Gather session, the host KV in place.
    two, both = (
        model.stepper(2, 64),
        BoundStepper(model.inference_session, model.manifest, 2, 64, StepOptions(("cuda", 0))),
    )
    rows = np.asarray([_prompt(9), _prompt(9, start=20)], dtype=np.int64)
    assert np.allclose(two.forward(rows), both.forward(rows), atol=1e-5)
    for s in (two, both):
        s.reorder([1, 1])
    want, got = _steps(two, [7, 8], 3), _steps(both, [7, 8], 3)
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(want, got))
