"""Fused graphs on onnxruntime 1.31 (onnxruntime-gpu's newest wheel): graphs/compat.py drops
GroupQueryAttention's query_seqlens input, and the loader opens the rewritten graph with the
weights read from the model's directory. 1.31 itself is not installed here; what runs here is
the rewrite, the loader's path for it, and the calls on which 1.31's kernel and 1.32's agree
(a prompt in one chunk, then decode steps, several rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

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


def test_plain_graphs_need_no_rewrite(tmp_path: Path, jamba_dir: Path) -> None:
    out = tmp_path / "plain"
    hybridrt.export_model(jamba_dir, out, fused_ops=False, validate=False)
    assert for_onnxruntime_131(out / "model.onnx") is None


def test_loader_rewrites_for_onnxruntime_131(jamba_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = np.random.default_rng(3).integers(3, 320, (3, 40)).tolist()
    greedy = {"max_new_tokens": 12, "do_sample": False}
    expected = hybridrt.load(jamba_onnx).generate(prompts, **greedy)
    opened: list[object] = []
    real = ort.InferenceSession

    def session(source: object, *args: object, **kwargs: object) -> object:
        opened.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ort, "__version__", "1.31.1")
    monkeypatch.setattr(ort, "InferenceSession", session)
    model = hybridrt.load(jamba_onnx)
    assert isinstance(opened[0], bytes)  # the rewritten graph, not the file
    assert model.generate(prompts, **greedy) == expected
