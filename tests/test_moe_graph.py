"""Mixture-of-experts layers in ONNX (models.ops.moe, quantization.moe): one com.microsoft MoE
node per layer, which runs only the chosen experts, exact against the reference; and the
experts at 4 or 8 bits as QMoE blocks, checked against their own dequantized weights."""

from __future__ import annotations

from pathlib import Path

import exports
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from family_checkpoints import make_granitemoehybrid
from onnx import helper, numpy_helper

import hybridrt
from hybridrt.quantization import quantize

# Experts of width 32 beside a hidden size of 32: blocks of 32 divide both.
MOE = dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2)
GREEDY = dict(max_new_tokens=12, do_sample=False)


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return exports.checkpoint(make_granitemoehybrid, **MOE)


@pytest.fixture(scope="module")
def exported(checkpoint: Path) -> Path:
    return exports.export(checkpoint, validate=True)


def _nodes(directory: Path, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(str(directory / "model.onnx")).graph.node if n.op_type == op_type]


def _attr(node: onnx.NodeProto, name: str) -> object:
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def test_experts_run_as_one_moe_node_per_layer_within_parity(exported: Path) -> None:
    """The dense every-expert Einsum is gone from the graph; the MoE node reads its experts in
    the interleaved layout onnxruntime's CPU kernel needs, and parity holds at 1e-4."""
    manifest = hybridrt.load(exported).manifest
    assert manifest.parity["passed"], manifest.parity
    moe = _nodes(exported, "MoE")
    assert len(moe) == len(manifest.config["layer_types"]) == 4
    assert not _nodes(exported, "Einsum")
    assert all(_attr(n, "swiglu_fusion") == 1 and _attr(n, "k") == 2 for n in moe)
    assert all(_attr(n, "normalize_routing_weights") == 1 for n in moe)  # Granite renormalizes the top-k


def _unpack(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, bits: int) -> np.ndarray:
    """[E, N, K * bits / 8] blocks back to float [E, N, K] (QMoE's documented formula)."""
    if bits == 4:
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:2], -1).astype(np.float32)
    else:
        q = packed.astype(np.float32)
    e, n, k = q.shape
    blocks = scales.shape[-1]
    if zero_points is None:
        z = np.full((e, n, blocks), 2 ** (bits - 1), np.float32)
    elif bits == 4:
        z = np.stack([zero_points & 0x0F, zero_points >> 4], axis=-1).reshape(e, n, -1)[..., :blocks]
    else:
        z = zero_points[..., :blocks]
    w = (q.reshape(e, n, blocks, -1) - z[..., None].astype(np.float32)) * scales[..., None]
    return w.reshape(e, n, k)


def _one_node(node: onnx.NodeProto, inits: list[onnx.TensorProto], d: int, e: int) -> ort.InferenceSession:
    graph = helper.make_graph(
        [node],
        "one",
        [
            helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, [None, d]),
            helper.make_tensor_value_info(node.input[1], onnx.TensorProto.FLOAT, [None, e]),
        ],
        [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, [None, d])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    )
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    ("mode", "bits", "symmetric", "algo"),
    [("int4", 4, False, "rtn"), ("int4", 4, True, "rtn"), ("int4", 4, True, None), ("int8-dynamic", 8, False, None)],
)
def test_quantized_experts_are_qmoe_blocks_that_dequantize_exactly(
    checkpoint: Path, tmp_path: Path, mode: str, bits: int, symmetric: bool, algo: str | None
) -> None:
    """Straight from the checkpoint: every MoE becomes QMoE, no float expert is left, and the
    QMoE node computes what a float MoE node over its dequantized experts computes (at
    accuracy level 0, float activations): a wrong packing order, scale or zero point layout
    would be off by the size of the weights. 8-bit experts run with int8 activations at every
    accuracy level, so they are held to the activations' rounding (2% of the output's scale)."""
    out = tmp_path / "q"
    # int4's default: searched scales in symmetric blocks (quantization.search)
    options: dict[str, object] = {"symmetric": True} if symmetric and algo else {}
    if algo:
        options["algo"] = algo
    hybridrt.export_model(checkpoint, out, quantize=mode, quantize_options=options)
    graph = onnx.load(str(out / "model.onnx")).graph
    qmoe = [n for n in graph.node if n.op_type == "QMoE"]
    assert len(qmoe) == 4 and not [n for n in graph.node if n.op_type == "MoE"]
    assert not [t for t in graph.initializer if "experts" in t.name and t.data_type == onnx.TensorProto.FLOAT]
    inits = {t.name: t for t in graph.initializer}
    node = qmoe[0]
    assert _attr(node, "expert_weight_bits") == bits and _attr(node, "block_size") == 32
    assert (len(node.input) > 11) != symmetric  # zero points only for asymmetric blocks
    array = {name: numpy_helper.to_array(inits[name]) for name in node.input if name in inits}
    zp1 = array[node.input[11]] if len(node.input) > 11 else None
    zp2 = array[node.input[12]] if len(node.input) > 12 else None
    w1 = _unpack(array[node.input[2]], array[node.input[3]], zp1, bits)
    w2 = _unpack(array[node.input[5]], array[node.input[6]], zp2, bits)
    e, _, d = w1.shape
    exact = onnx.NodeProto()
    exact.CopyFrom(node)
    for a in exact.attribute:
        if a.name == "accuracy_level":
            a.i = 0
    float_node = helper.make_node(
        "MoE",
        [node.input[0], node.input[1], "w1", "", "w2"],
        list(node.output),
        domain="com.microsoft",
        **{
            a.name: helper.get_attribute_value(a)
            for a in node.attribute
            if a.name not in ("expert_weight_bits", "block_size", "accuracy_level")
        },
    )
    rng = np.random.default_rng(0)
    feeds = {
        node.input[0]: rng.standard_normal((7, d)).astype(np.float32),
        node.input[1]: rng.standard_normal((7, e)).astype(np.float32),
    }
    got = _one_node(exact, [inits[n] for n in node.input if n in inits], d, e).run(None, feeds)[0]
    want = _one_node(float_node, [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")], d, e).run(
        None, feeds
    )[0]
    if bits == 4:
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    else:  # 8-bit experts always take int8 activations (onnxruntime has no float kernel for them)
        assert np.abs(got - want).max() < 0.02 * np.abs(want).max()
    assert len(hybridrt.load(out).generate([1, 5, 7], **GREEDY)) == GREEDY["max_new_tokens"]


def test_direct_export_equals_export_then_quantize(
    checkpoint: Path, exported: Path, text_file: Path, tmp_path: Path
) -> None:
    """`export --quantize int4` and `export` + `quantize --mode int4` store the same experts."""
    direct = tmp_path / "direct"
    hybridrt.export_model(checkpoint, direct, quantize="int4")
    two_step = tmp_path / "two-step"
    quantize(exported, two_step, "int4", eval_text=text_file, agreement_prompts=2, eval_tokens=128, eval_window=64)

    def experts(directory: Path) -> dict[str, bytes]:
        graph = onnx.load(str(directory / "model.onnx")).graph
        names = {i for n in graph.node if n.op_type == "QMoE" for i in n.input[2:]}
        return {t.name: numpy_helper.to_array(t).tobytes() for t in graph.initializer if t.name in names}

    a, b = experts(direct), experts(two_step)
    assert a and a == b


def test_experts_no_block_divides_stay_float_with_the_reason(tmp_path: Path) -> None:
    """Experts 24 wide: no power-of-two block of 16 or more divides 24, so the layer keeps its
    float MoE node and the manifest says why, instead of a QMoE onnxruntime would refuse."""
    src = exports.checkpoint(make_granitemoehybrid, intermediate_size=24)
    manifest = hybridrt.export_model(src, tmp_path / "q", quantize="int4", validate=False)
    assert manifest.quantization is not None
    reasons = {k: v for k, v in manifest.quantization["excluded"].items() if k.endswith("/MoE")}
    assert len(reasons) == 4 and all("block size" in v for v in reasons.values())
    assert len(_nodes(tmp_path / "q", "MoE")) == 4
