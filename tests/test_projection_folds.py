"""Constants folded into the projections that produce what they act on: multipliers into the
weight at export (export.projections.fold_scales), biases into a quantized MatMulNBits node
(quantization.rewrites.fold_biases). Each graph loses the node, computes the same values, and
a quantized projection needs no node after it."""

from __future__ import annotations

from pathlib import Path

import exports
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from family_checkpoints import make_granitemoehybrid_dense
from onnx import TensorProto, helper, numpy_helper

from hybridrt.export.projections import fold_scales
from hybridrt.graphs.manifest import read_manifest
from hybridrt.quantization import quantize
from hybridrt.quantization.methods import weight_only
from hybridrt.quantization.rewrites import fold_biases

RNG = np.random.default_rng(0)


def _projection(scale: np.ndarray, *, bias: bool = True, reads: int = 1, weight: str = "w") -> onnx.ModelProto:
    """y = (x @ w + b) * scale, with the product also read by a Relu when `reads` is 2."""
    w = RNG.standard_normal((6, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(w, weight), numpy_helper.from_array(scale.astype(np.float32), "c")]
    nodes = [helper.make_node("MatMul", ["x", weight], ["xw"])]
    product = "xw"
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(5).astype(np.float32), "b"))
        nodes.append(helper.make_node("Add", ["xw", "b"], ["xwb"]))
        product = "xwb"
    nodes.append(helper.make_node("Mul", [product, "c"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if reads == 2:
        nodes.append(helper.make_node("Relu", [product], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6])], outputs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, {"x": x}))


@pytest.mark.parametrize("scale", [np.array(0.6), np.array([[[0.5, 2.0, -1.0, 3.0, 0.25]]])], ids=["scalar", "vector"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_scaled_projection_loses_its_mul_and_keeps_its_values(scale: np.ndarray, bias: bool) -> None:
    model = _projection(scale, bias=bias)
    x = RNG.standard_normal((2, 3, 6)).astype(np.float32)
    (before,) = _run(model, x)
    assert fold_scales(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add"] if bias else ["MatMul"]
    assert model.graph.node[-1].output[0] == "y"  # the graph's output keeps its name
    assert "c" not in {t.name for t in model.graph.initializer}
    (after,) = _run(model, x)
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)


def test_a_product_read_elsewhere_or_a_shared_weight_is_left_alone() -> None:
    """The unscaled product is still needed when something else reads it; a weight that is
    not the graph's own (one several layers share) must not change for one of them."""
    twice = _projection(np.array(0.6), reads=2)
    assert fold_scales(twice) == 0 and "Mul" in [n.op_type for n in twice.graph.node]
    shared = _projection(np.array(0.6), weight="model.shared.w")
    assert fold_scales(shared, lambda name: name.startswith("model.layers.")) == 0
    wrong_axis = _projection(np.ones((3, 1), np.float32))  # per row, not per output channel
    assert fold_scales(wrong_axis) == 0


def test_a_product_an_if_branch_reads_is_left_alone() -> None:
    """A branch of an If reads outer values by name, not as the node's inputs: that read
    counts, or folding would rename the product the branch needs."""
    model = _projection(np.array(0.6), bias=False)
    branch = helper.make_graph(
        [helper.make_node("Identity", ["xw"], ["inner"])],
        "then",
        [],
        [helper.make_tensor_value_info("inner", TensorProto.FLOAT, None)],
    )
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
    model.graph.node.append(helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    assert fold_scales(model) == 0
    x = RNG.standard_normal((2, 3, 6)).astype(np.float32)
    y, z = _run(model, x)
    np.testing.assert_allclose(y, z * 0.6, rtol=1e-6)


@pytest.fixture(scope="module")
def granite_onnx() -> Path:
    return exports.family(make_granitemoehybrid_dense)


def _scaled_projections(model: onnx.ModelProto) -> list[str]:
    """Muls that read a projection's output (MatMul or MatMulNBits) and a constant."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type == "Mul" and any(i in inits for i in node.input):
            read = [producer.get(i) for i in node.input if i not in inits]
            if read and read[0] is not None and read[0].op_type in ("MatMul", "MatMulNBits"):
                found.append(node.name)
    return found


def test_granite_residual_multiplier_folds_into_every_output_projection(
    granite_onnx: Path, text_file: Path, tmp_path: Path
) -> None:
    """Granite's residual_multiplier (0.6 here) scaled each block's two outputs with a Mul of
    their own, one node per block output per decode step; the export folds it into the weights
    and stays within the parity tolerance, and the int4 graph has no Mul after its
    MatMulNBits either."""
    manifest = read_manifest(granite_onnx)
    assert manifest.provenance["fused_norms"]["folded_scales"] == 2 * len(manifest.layer_types)
    assert manifest.parity is not None and manifest.parity["passed"] is True
    assert _scaled_projections(onnx.load(str(granite_onnx / "model.onnx"))) == []
    out = tmp_path / "int4"
    quantize(granite_onnx, out, mode="int4", eval_text=text_file, eval_tokens=192, eval_window=128)
    graph = onnx.load(str(out / "model.onnx"))
    assert any(n.op_type == "MatMulNBits" for n in graph.graph.node)
    assert _scaled_projections(graph) == []
    # Each Mamba2 layer's dt_bias is its in_proj's bias: no Add after the projection's Split.
    biased = [n.name for n in graph.graph.node if n.op_type == "MatMulNBits" and len(n.input) > 5 and n.input[5]]
    mamba2 = [i for i, kind in enumerate(read_manifest(out).layer_types) if kind == "mamba2"]
    assert biased == [f"/model/layers.{i}/mixer/in_proj/MatMul_Q4" for i in mamba2]
    assert not [n for n in graph.graph.node if n.op_type == "Add" and "dt_bias" in " ".join(n.input)]


def _biased_projections() -> onnx.ModelProto:
    """in_proj -> Split [32, 40, 24] along the last axis with a bias on the last part alone (as
    Mamba2's dt_bias), and out_proj + a bias of its own."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "l", 64])
    inits = [
        numpy_helper.from_array(RNG.standard_normal((64, 96)).astype(np.float32), "in_w"),
        numpy_helper.from_array(np.array([32, 40, 24], np.int64), "sizes"),
        numpy_helper.from_array(RNG.standard_normal(24).astype(np.float32), "dt_bias"),
        numpy_helper.from_array(RNG.standard_normal((64, 32)).astype(np.float32), "out_w"),
        numpy_helper.from_array(RNG.standard_normal(32).astype(np.float32), "out_b"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "in_w"], ["proj"], name="in_proj/MatMul"),
        helper.make_node("Split", ["proj", "sizes"], ["z", "xbc", "dt"], axis=2),
        helper.make_node("Add", ["dt", "dt_bias"], ["dt_b"], name="dt/Add"),
        helper.make_node("MatMul", ["x", "out_w"], ["o"], name="out_proj/MatMul"),
        helper.make_node("Add", ["o", "out_b"], ["ob"], name="out/Add"),
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("z", "xbc", "dt_b", "ob")]
    graph = helper.make_graph(nodes, "g", [x], outs, inits)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    )


@pytest.mark.parametrize("bits", [4, 8])
def test_a_bias_after_a_quantized_projection_joins_the_node(bits: int) -> None:
    """Mamba2's dt_bias was an Add of its own after in_proj's Split in every layer's step; it is
    the MatMulNBits node's bias now (zero over the other parts), with the same values."""
    model = weight_only(_biased_projections(), bits, "rtn", 32, ["in_proj/MatMul", "out_proj/MatMul"], None)
    x = RNG.standard_normal((2, 3, 64)).astype(np.float32)
    before = _run(model, x)
    assert fold_biases(model.graph) == 2
    assert [n.op_type for n in model.graph.node].count("Add") == 0
    matmuls = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(matmuls) == 2 and all(len(n.input) == 6 and n.input[5] for n in matmuls)
    assert not {"dt_bias", "out_b"} & {t.name for t in model.graph.initializer}
    after = _run(model, x)
    for a, b in zip(after, before):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_bias_add_read_with_the_product_elsewhere_stays() -> None:
    model = weight_only(_biased_projections(), 4, "rtn", 32, ["in_proj/MatMul", "out_proj/MatMul"], None)
    model.graph.node.append(helper.make_node("Relu", ["o"], ["o_relu"]))  # the unbiased product is needed
    model.graph.output.append(helper.make_tensor_value_info("o_relu", TensorProto.FLOAT, None))
    assert fold_biases(model.graph) == 1  # the dt part's bias only
    assert [n.name for n in model.graph.node if n.op_type == "Add"] == ["out/Add"]
