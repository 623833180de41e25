"""Fused graphs on onnxruntime 1.31 (onnxruntime-gpu's newest wheel): graphs/compat.py drops
GroupQueryAttention's query_seqlens input, and the loader opens the rewritten graph with the
weights read from the model's directory. 1.31 itself is not installed here; what runs here is
the rewrite, the loader's path for it, and the calls on which 1.31's kernel and 1.32's agree
(a prompt in one chunk, then decode steps, several rows)."""

from __future__ import annotations

from pathlib import Path

import exports
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from checkpoints import make_jamba

import hybridrt
from hybridrt.graphs.compat import QUERY_SEQLENS, for_onnxruntime_131, needs_query_seqlens


def test_versions() -> None:
    assert needs_query_seqlens("1.32.0") and needs_query_seqlens("1.33.1") and needs_query_seqlens("2.0.0")
    assert not needs_query_seqlens("1.31.1") and not needs_query_seqlens("1.30.0")


def test_rewrite_drops_only_query_seqlens(jamba_onnx: Path) -> None:
    graph = jamba_onnx / "model.onnx"
    before = onnx.load(str(graph), load_external_data=False)
    rewritten = for_onnxruntime_131(graph)
    assert rewritten is not None
    after = onnx.ModelProto.FromString(rewritten)
    pairs = list(zip(before.graph.node, after.graph.node))
    assert len(pairs) == len(before.graph.node) == len(after.graph.node)
    changed = 0
    for old, new in pairs:
        if old.op_type == "GroupQueryAttention":
            assert len(old.input) == QUERY_SEQLENS + 1 and old.input[QUERY_SEQLENS].endswith("query_seqlens")
            assert list(new.input) == [i for i in old.input[:QUERY_SEQLENS]][: len(new.input)]
            assert all(not i for i in old.input[len(new.input) : QUERY_SEQLENS])
            changed += 1
        else:
            assert old == new
    assert changed
    assert list(after.graph.initializer) == list(before.graph.initializer)  # weights stay external


def test_loader_rewrites_for_onnxruntime_131(jamba_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On 1.31 (its refusal of the file simulated here), the loader opens the rewritten bytes,
    marks the model, and prefill then runs prompts of several chunks a row at a time."""
    from hybridrt.runtime.bound import BoundStepper
    from hybridrt.runtime.decode import PREFILL_CHUNK

    prompts = np.random.default_rng(3).integers(3, 320, (3, 40)).tolist()
    greedy = {"max_new_tokens": 12, "do_sample": False}
    expected = hybridrt.load(jamba_onnx).generate(prompts, **greedy)
    opened: list[object] = []
    real = ort.InferenceSession

    def session(source: object, *args: object, **kwargs: object) -> object:
        opened.append(source)
        if isinstance(source, str):  # as 1.31 answers the fused graph
            raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : GroupQueryAttention")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ort, "__version__", "1.31.1")
    monkeypatch.setattr(ort, "InferenceSession", session)
    model = hybridrt.load(jamba_onnx)
    assert isinstance(opened[0], str) and isinstance(opened[-1], bytes)  # the file, then the rewrite
    assert not model.batched_chunks
    assert model.generate(prompts, **greedy) == expected  # prompts of one chunk: one call
    calls: list[tuple[int, ...]] = []
    forward = BoundStepper.forward

    def spy(self: BoundStepper, ids: np.ndarray, *args: object, **kwargs: object) -> np.ndarray:
        calls.append(ids.shape)
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(BoundStepper, "forward", spy)
    long = np.random.default_rng(4).integers(3, 320, (2, PREFILL_CHUNK + 20)).tolist()
    assert len(model.generate(long, max_new_tokens=3, do_sample=False)) == 2
    assert calls and all(b == 1 for b, n in calls if n > 1)  # chunks one row at a time
    assert any(b == 2 for b, n in calls)  # the decode steps still batch the rows


def test_plain_graphs_are_not_rewritten(monkeypatch: pytest.MonkeyPatch) -> None:
    out = exports.export(make_jamba, fused_ops=False, validate=True)
    assert for_onnxruntime_131(out / "model.onnx") is None  # no GroupQueryAttention to rewrite
    monkeypatch.setattr(ort, "__version__", "1.31.1")
    assert hybridrt.load(out).batched_chunks  # opened as it is, even without onnx
