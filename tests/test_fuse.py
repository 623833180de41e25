"""RMSNorm fusion in ONNX exports (export.fuse): each norm becomes onnxruntime's
SimplifiedLayerNormalization, or SkipSimplifiedLayerNormalization with the residual Add before
it; the graph's contract, its parity and quantization are unchanged."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import exports
import onnx
import pytest
from checkpoints import make_jamba
from onnx import TensorProto

import hybridrt
from hybridrt.graphs.manifest import read_manifest
from hybridrt.quantization import quantize
from hybridrt.quantization.selection import DEFAULT_KEEP_FLOAT

FUSED = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
SMALL = exports.QUICK


def _graph(directory: Path) -> onnx.ModelProto:
    return onnx.load(str(directory / "model.onnx"))


def _layer_norms(n_layers: int) -> list[str]:
    """The scopes of the decoder's own norms: per layer input_norm and ffn_norm, then the final norm."""
    return [f"/model/layers.{i}/{n}" for i in range(n_layers) for n in ("input_norm", "ffn_norm")] + ["/model/norm"]


@pytest.fixture(scope="module")
def unfused_onnx() -> Path:
    return exports.export(make_jamba, fuse_norms=False, validate=True)


def test_every_decoder_norm_is_fused_with_its_residual_add(jamba_onnx: Path) -> None:
    graph = _graph(jamba_onnx)
    manifest = read_manifest(jamba_onnx)
    by_name = {n.name: n for n in graph.graph.node}
    scopes = _layer_norms(len(manifest.layer_types))
    # The first norm reads the embedding (no residual Add before it); every later one follows one.
    assert by_name[f"{scopes[0]}/SimplifiedLayerNormalization"].op_type == "SimplifiedLayerNormalization"
    for scope in scopes[1:]:
        node = by_name[f"{scope}/SkipSimplifiedLayerNormalization"]
        assert node.domain == "com.microsoft" and len(node.input) == 3
    # No norm is left as Pow -> ReduceMean -> ... (the Mamba dt/B/C norms fuse too).
    assert not [n.name for n in graph.graph.node if n.op_type in ("Pow", "ReduceMean", "Sqrt", "Reciprocal")]
    fused = [n for n in graph.graph.node if n.op_type in FUSED]
    assert len({n.name for n in fused}) == len(fused)
    # Named inside their norm's scope, so the quantizer's keep-float "*norm*" rule matches them.
    assert all(any(fnmatchcase(n.name, k.pattern) for k in DEFAULT_KEEP_FLOAT) for n in fused)
    record = manifest.provenance["fused_norms"]
    assert record["SkipSimplifiedLayerNormalization"] == len(scopes) - 1
    assert record["SimplifiedLayerNormalization"] == len(fused) - len(scopes) + 1
    assert record["skip_fusion"] is True and record["unfused"] == []
    assert manifest.provenance["fused_ops"] is True
    assert manifest.parity is not None and manifest.parity["passed"] is True


def test_fusion_keeps_the_contract_and_replaces_seven_nodes_per_norm(jamba_onnx: Path, unfused_onnx: Path) -> None:
    fused, plain = _graph(jamba_onnx), _graph(unfused_onnx)
    for a, b in ((fused.graph.input, plain.graph.input), (fused.graph.output, plain.graph.output)):
        assert [v.SerializeToString() for v in a] == [v.SerializeToString() for v in b]
    assert read_manifest(jamba_onnx).inputs == read_manifest(unfused_onnx).inputs
    assert read_manifest(jamba_onnx).outputs == read_manifest(unfused_onnx).outputs
    ops = [n.op_type for n in fused.graph.node]
    n_norms, n_skip = sum(op in FUSED for op in ops), ops.count("SkipSimplifiedLayerNormalization")
    # ... and the three projections before each GroupQueryAttention became one MatMul.
    record = read_manifest(jamba_onnx).provenance["fused_norms"]
    packed = record["packed_qkv"]
    assert packed == ops.count("GroupQueryAttention") > 0
    assert len(plain.graph.node) - len(fused.graph.node) == 6 * n_norms + n_skip + 2 * packed
    assert not {n.op_type for n in plain.graph.node} & set(FUSED)
    assert read_manifest(unfused_onnx).provenance["fused_norms"] is False


def test_fused_and_unfused_graphs_generate_the_same_tokens(jamba_onnx: Path, unfused_onnx: Path) -> None:
    prompt = [5, 6, 7, 8, 9]
    a = hybridrt.load(jamba_onnx).generate(prompt, max_new_tokens=16, do_sample=False)
    b = hybridrt.load(unfused_onnx).generate(prompt, max_new_tokens=16, do_sample=False)
    assert a == b


def test_plain_ops_export_has_no_onnxruntime_operators() -> None:
    """--plain-ops: no fused norms either (SimplifiedLayerNormalization is onnxruntime's, though
    registered in the default domain)."""
    out = exports.export(make_jamba, fused_ops=False, validate=True)
    manifest = read_manifest(out)
    graph = _graph(out)
    assert {n.domain for n in graph.graph.node} <= {"", "ai.onnx"}
    assert not {n.op_type for n in graph.graph.node} & set(FUSED)
    assert {o.domain for o in graph.opset_import} <= {"", "ai.onnx"}
    assert manifest.provenance["fused_norms"] is False


@pytest.mark.parametrize("mode", ["int4", "int8-dynamic"])
def test_quantizing_a_fused_graph_keeps_the_norms_float(
    mode: str, jamba_onnx: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from checkpoints import TEXT

    text = tmp_path_factory.mktemp("text") / "code.txt"
    text.write_text(TEXT * 8, encoding="utf-8")
    out = tmp_path / "q"
    manifest = quantize(jamba_onnx, out, mode, calibration=[text], **SMALL)
    parent = {n.name: n for n in _graph(jamba_onnx).graph.node if n.op_type in FUSED}
    graph = _graph(out)
    fused = {n.name: n for n in graph.graph.node if n.op_type in FUSED}
    assert fused.keys() == parent.keys()
    floats = {t.name for t in graph.graph.initializer if t.data_type == TensorProto.FLOAT}
    producer = {o: n.op_type for n in graph.graph.node for o in n.output}
    for name, node in fused.items():
        assert list(node.input) == list(parent[name].input), name
        assert node.input[-1] in floats, name  # the norm's weight stays a float initializer
        assert not {producer.get(i) for i in node.input} & {"DequantizeLinear", "DynamicQuantizeLinear"}, name
    assert manifest.quantization is not None and manifest.quantization["mode"] == mode
    assert len(hybridrt.load(out).generate([5, 6, 7], max_new_tokens=4, do_sample=False)) == 4
