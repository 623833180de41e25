"""Quantization on the graph level: which nodes are selected, and hybridrt's own rewrites
(private weights, the block-wise embedding and LM head) on small hand-built graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hybridrt.quantization import QuantConfig
from hybridrt.quantization.rewrites import give_private_weights
from hybridrt.quantization.selection import select_nodes
from hybridrt.quantization.vocab import find_vocab_nodes, quantize_vocab

# the tiny Jamba of checkpoints.make_jamba: attention every second layer
JAMBA_KINDS = ("mamba", "attention", "mamba", "attention")


@pytest.fixture(scope="module")
def jamba_graph(jamba_onnx: Path) -> onnx.GraphProto:
    return onnx.load(str(jamba_onnx / "model.onnx")).graph


def test_default_keep_float_list_and_state_rules(jamba_graph: onnx.GraphProto) -> None:
    default = select_nodes(jamba_graph, QuantConfig(), JAMBA_KINDS)
    kept = set(default.excluded)
    assert "/model/layers.0/mixer/dt_proj/MatMul" in kept
    # The MoE router (a float Gemm over the tokens) is never quantized; the experts' MoE node is.
    assert not [n for n in default.quantize if "/router/" in n]
    assert "/model/layers.1/ffn/MoE" in default.quantize
    # Attention over the KV buffers is one GroupQueryAttention node (no weight): never selected.
    cores = [n.name for n in jamba_graph.node if n.op_type == "GroupQueryAttention"]
    assert cores == ["/model/layers.1/mixer/GroupQueryAttention", "/model/layers.3/mixer/GroupQueryAttention"]
    assert not set(cores) & (set(default.quantize) | set(default.vocab))
    assert "/model/layers.0/mixer/in_proj/MatMul" in default.quantize
    assert "mamba layer" in default.excluded["/model/layers.0/mixer/dt_proj/MatMul"]


def test_kind_rules_apply_to_layers_of_that_kind_only(jamba_graph: onnx.GraphProto) -> None:
    """A kind's keep-float rule (hybridrt.kinds) is anchored at its own layers: declared as if
    layer 0 were attention, the Mamba dt_proj of layer 0 is quantized and layer 2's kept."""
    swapped = select_nodes(jamba_graph, QuantConfig(), ("attention", "attention", "mamba", "attention"))
    assert "/model/layers.0/mixer/dt_proj/MatMul" in swapped.quantize
    assert "/model/layers.2/mixer/dt_proj/MatMul" in swapped.excluded


def test_vocabulary_nodes_are_selected_apart(jamba_graph: onnx.GraphProto) -> None:
    default = select_nodes(jamba_graph, QuantConfig(), JAMBA_KINDS)
    assert default.vocab == ["/model/embed_tokens/Gather", "/lm_head/MatMul"]
    assert not set(default.vocab) & set(default.quantize)


def test_include_and_exclude_patterns_override_the_defaults(jamba_graph: onnx.GraphProto) -> None:
    forced = select_nodes(
        jamba_graph, QuantConfig(include=("*/dt_proj/*",), exclude=("*/in_proj/*", "/lm_head/*", "*/embed_tokens/*"))
    )
    assert "/model/layers.0/mixer/dt_proj/MatMul" in forced.quantize
    assert "/model/layers.0/mixer/in_proj/MatMul" in forced.excluded
    assert forced.vocab == [] and {"/lm_head/MatMul", "/model/embed_tokens/Gather"} <= set(forced.excluded)


def test_int8_static_keeps_gated_inputs_float(jamba_graph: onnx.GraphProto) -> None:
    """int8-static keeps the inputs of out_proj and down_proj float (their weights still int8)."""
    static = select_nodes(jamba_graph, QuantConfig(mode="int8-static"))
    assert "/model/layers.0/mixer/out_proj/MatMul" in static.float_activations
    assert "/model/layers.0/mixer/out_proj/MatMul" not in static.static
    assert "/model/layers.0/mixer/in_proj/MatMul" in static.static
    assert select_nodes(jamba_graph, QuantConfig(mode="int4")).float_activations == {}  # weight-only anyway
    only = select_nodes(jamba_graph, QuantConfig(mode="int8-static", float_activations=("*/in_proj/*",)))
    assert set(only.float_activations) == {n for n in only.quantize if "/in_proj/" in n}


def test_dropping_the_default_list_keeps_the_state_rules(jamba_graph: onnx.GraphProto) -> None:
    bare = select_nodes(jamba_graph, QuantConfig(keep_float_default=False))
    assert "/model/layers.0/mixer/dt_proj/MatMul" in bare.quantize
    # The state rules hold regardless: a MatMul of two activations (attention in a plain-op
    # graph) is never quantized.
    a, b = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in "ab")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="/model/layers.1/mixer/MatMul")
    plain = select_nodes(helper.make_graph([node], "g", [a, b], [y]), QuantConfig(keep_float_default=False))
    assert "/model/layers.1/mixer/MatMul" in plain.excluded and not plain.quantize


# A tied LM head as hybridrt's export writes it (FusedMatMul reading the table transposed) and
# as older exports and other exporters write it (MatMul of a Transpose of the table).
TIED_HEADS = ["fused", "transpose"]


def _tied_head(head: str, x: str) -> list[onnx.NodeProto]:
    if head == "fused":
        return [
            helper.make_node(
                "FusedMatMul", [x, "emb"], ["logits"], name="/lm_head/MatMul", domain="com.microsoft", transB=1
            )
        ]
    return [
        helper.make_node("Transpose", ["emb"], ["embT"], name="/lm_head/Transpose", perm=[1, 0]),
        helper.make_node("MatMul", [x, "embT"], ["logits"], name="/lm_head/MatMul"),
    ]


@pytest.mark.parametrize("head", TIED_HEADS)
def test_tied_lm_head_gets_a_private_weight(head: str) -> None:
    """A weight tied to the embedding reaches lm_head through a Transpose or a transB=1
    FusedMatMul, which every onnxruntime quantizer skips as a non-constant weight."""
    emb = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["h"], name="/model/embed_tokens/Gather"), *_tied_head(head, "h")],
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2, 4])],
        [numpy_helper.from_array(emb, "emb")],
    )
    assert give_private_weights(graph, ["/lm_head/MatMul"]) == ["/lm_head/MatMul"]
    matmul = next(n for n in graph.node if n.op_type == "MatMul")
    weight = next(t for t in graph.initializer if t.name == matmul.input[1])
    np.testing.assert_array_equal(numpy_helper.to_array(weight), emb.T)
    assert [(n.op_type, n.domain, len(n.attribute)) for n in graph.node] == [("Gather", "", 0), ("MatMul", "", 0)]


def _tied_graph(vocab: int = 64, hidden: int = 32, head: str = "fused") -> tuple[onnx.GraphProto, np.ndarray]:
    table = np.random.default_rng(0).standard_normal((vocab, hidden)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "input_ids"], ["h"], name="/model/embed_tokens/Gather"),
            *_tied_head(head, "h"),
        ],
        "tied",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])],
        [numpy_helper.from_array(table, "emb")],
    )
    return graph, table


def _run_graph(graph: onnx.GraphProto, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input_ids": ids})[0]


def _dequantize(packed: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """[vocab, k_blocks, blob] symmetric blocks (zero point 2^(bits-1)) -> [vocab, hidden]."""
    if bits == 4:
        values = np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:2], -1)
    else:
        values = packed
    return ((values.astype(np.float32) - 2 ** (bits - 1)) * scales[..., None]).reshape(packed.shape[0], -1)


@pytest.mark.parametrize("head", TIED_HEADS)
@pytest.mark.parametrize("bits", [4, 8])
def test_tied_embedding_and_lm_head_share_one_quantized_table(bits: int, head: str) -> None:
    graph, table = _tied_graph(head=head)
    ids = np.array([[0, 5, 63], [7, 7, 1]], dtype=np.int64)
    nodes = find_vocab_nodes(graph)
    assert nodes.tied and nodes.gather == "/model/embed_tokens/Gather" and nodes.head == "/lm_head/MatMul"
    record = quantize_vocab(graph, nodes, set(nodes.names), bits, 32, accuracy_level=0)
    assert record["shared"] and record["embedding"] == "GatherBlockQuantized" and record["lm_head"] == "MatMulNBits"
    gbq = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    head = next(n for n in graph.node if n.op_type == "MatMulNBits")
    assert gbq.input[0] == head.input[1]  # one tensor for both
    assert not any(t.data_type == TensorProto.FLOAT and t.name == "emb" for t in graph.initializer)
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    dequantized = _dequantize(inits[head.input[1]], inits[head.input[2]], bits)
    assert record["bytes"] < record["parent_bytes"] / (3 if bits == 8 else 5)
    # The graph computes exactly with the dequantized table, and that table is the float one
    # up to one step per block (scale = the block's largest |w| / 2^(bits-1); the largest
    # value of the other sign may clip by one step, every other value rounds to half a step).
    expected = np.einsum("bsh,vh->bsv", dequantized[ids], dequantized)
    np.testing.assert_allclose(_run_graph(graph, ids), expected, rtol=1e-4, atol=1e-4)
    step = np.abs(table).reshape(64, -1, 32).max(-1, keepdims=True) / 2 ** (bits - 1)
    error = np.abs(dequantized - table).reshape(64, -1, 32)
    assert np.all(error <= step * 1.0001) and np.mean(error <= step / 2 + 1e-6) > 0.99


@pytest.mark.parametrize("head", TIED_HEADS)
def test_lm_head_alone_keeps_the_float_embedding(head: str) -> None:
    graph, table = _tied_graph(head=head)
    ids = np.array([[3, 4]], dtype=np.int64)
    float_logits = _run_graph(graph, ids)
    nodes = find_vocab_nodes(graph)
    record = quantize_vocab(graph, nodes, {"/lm_head/MatMul"}, 8, 32, accuracy_level=0)
    assert record["embedding"] is None and record["lm_head"] == "MatMulNBits" and not record["shared"]
    assert [n.op_type for n in graph.node] == ["Gather", "MatMulNBits"]
    assert record["bytes"] > table.nbytes  # the float table stays for the Gather
    # 8-bit blocks: each logit within 1% of the largest one (measured: 0.3%).
    assert np.abs(_run_graph(graph, ids) - float_logits).max() <= 0.01 * np.abs(float_logits).max()


def test_scaled_untied_head_is_found() -> None:
    """Granite divides the logits by logits_scaling: the head MatMul does not write `logits`."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "input_ids"], ["h"], name="/model/embed_tokens/Gather"),
            helper.make_node("MatMul", ["h", "head"], ["raw"], name="/lm_head/MatMul"),
            helper.make_node("Div", ["raw", "scale"], ["logits"], name="/Div"),
        ],
        "scaled",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 64])],
        [
            numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "emb"),
            numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32), "head"),
            numpy_helper.from_array(np.array(8.0, np.float32), "scale"),
        ],
    )
    nodes = find_vocab_nodes(graph)
    assert (nodes.gather, nodes.table, nodes.head, nodes.head_weight, nodes.tied) == (
        "/model/embed_tokens/Gather",
        "emb",
        "/lm_head/MatMul",
        "head",
        False,
    )
