"""Rewrites of an exported ONNX graph: RMSNorm fusion with onnxruntime.transformers' own
passes, then our own hybrid-specific ones (`pack_qkv`, `expand_selective_scans`).

torch's exporter (opset 20) writes each RMSNorm as Pow -> ReduceMean -> Add(eps) -> Sqrt ->
Reciprocal -> Mul -> Mul(weight), seven nodes that onnxruntime's in-session optimizer does
not fuse (it only matches the Div form). Two passes of onnxruntime.transformers do, offline:

- FusionSimplifiedLayerNormalization: the seven nodes become one SimplifiedLayerNormalization
  (an onnxruntime kernel registered in the default domain);
- FusionSkipSimplifiedLayerNormalization: the residual Add in front of a norm joins it as one
  com.microsoft SkipSimplifiedLayerNormalization, whose fourth output is the sum (the residual
  stream the next layer adds to).

Only these two passes run (no attention, GELU or bias fusions). The graph's inputs, outputs and
their names are untouched; each fused node is named after the norm it replaces
(/model/layers.3/ffn_norm/SkipSimplifiedLayerNormalization), so name-based rules such as
quantization's keep-float "*norm*" still find it. Norms the passes do not match (a norm whose
input is not a residual Add, say) stay as they were or become SimplifiedLayerNormalization only.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from typing import Any

import onnx

FUSED_NORM_OPS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
# Distinct sizes for the graph's symbolic dims, used only if symbolic shape inference cannot
# decide a comparison on its own (the Skip pass compares the residual Add's input shapes).
_CONCRETE_DIMS = {"batch": 3, "seq": 7, "n_logits": 7, "capacity": 18}


def fuse_norms(model: onnx.ModelProto) -> dict[str, Any]:
    """Fuse RMSNorms (and the residual Adds before them) in `model`, in place.

    Returns what was done, for the manifest's provenance: the count of each fused op, and the
    scopes of norms left as plain operators."""
    from onnxruntime.transformers.fusion_simplified_layernorm import FusionSimplifiedLayerNormalization
    from onnxruntime.transformers.onnx_model import OnnxModel

    _quiet_optimizer_logs()
    graph = model.graph
    io_before = _io(graph)
    producer = {o: n.name for n in graph.node for o in n.output if o}
    order = {n.name: i for i, n in enumerate(graph.node)}
    original = {n.name for n in graph.node}

    onnx_model = OnnxModel(model)
    FusionSimplifiedLayerNormalization(onnx_model).apply()
    skip = _skip_fusion(onnx_model)
    if skip is not None:
        skip.apply()

    _rename(graph, producer, original)
    if any(n.domain == "com.microsoft" for n in graph.node) and not any(
        o.domain == "com.microsoft" for o in model.opset_import
    ):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    _sort(graph, order, producer)
    if _io(graph) != io_before:  # the passes never touch them; a guard, not a code path
        raise RuntimeError("RMSNorm fusion changed the graph's inputs or outputs")
    counts = Counter(n.op_type for n in graph.node if n.op_type in FUSED_NORM_OPS)
    return {
        "passes": "onnxruntime.transformers FusionSimplifiedLayerNormalization, FusionSkipSimplifiedLayerNormalization",
        **{op: counts.get(op, 0) for op in FUSED_NORM_OPS},
        "skip_fusion": skip is not None,
        "unfused": sorted({_scope(n.name) for n in graph.node if n.op_type == "ReduceMean" and "norm" in n.name}),
    }


def _skip_fusion(onnx_model: Any) -> Any:
    """The Skip pass with a shape-inference helper that knows com.microsoft LinearAttention and
    CausalConvWithState (onnxruntime's symbolic shape inference stops at them, and the pass
    then fuses nothing after them)."""
    from onnxruntime.transformers.fusion_simplified_layernorm import FusionSkipSimplifiedLayerNormalization

    helper = _shape_helper(onnx_model.model)
    if helper is None:
        logging.getLogger(__name__).warning("shape inference failed: residual Adds stay unfused")
        return None

    class SkipFusion(FusionSkipSimplifiedLayerNormalization):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            # The parent constructor runs its own shape inference (which stops at
            # LinearAttention); shape_infer=False skips it, the helper above replaces it.
            super(FusionSkipSimplifiedLayerNormalization, self).__init__(
                onnx_model, "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", shape_infer=False
            )
            self.shape_infer_helper = helper

    return SkipFusion()


def _shape_helper(model: onnx.ModelProto) -> Any:
    from onnxruntime.transformers.onnx_model import OnnxModel  # noqa: F401  (puts tools/ on sys.path)
    from shape_infer_helper import SymbolicShapeInferenceHelper  # type: ignore[import-not-found]
    from symbolic_shape_infer import get_attribute, get_shape_from_sympy_shape  # type: ignore[import-not-found]

    class Helper(SymbolicShapeInferenceHelper):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(model)
            self.dispatcher_["LinearAttention"] = self._infer_linear_attention
            self.dispatcher_["CausalConvWithState"] = self._infer_causal_conv
            self.dispatcher_["SelectiveScan"] = self._infer_selective_scan

        def _infer_linear_attention(self, node: onnx.NodeProto) -> None:
            # output [b, t, q_heads * dv] with dv = value's last dim / kv_heads; present_state = past_state
            dtype = self.known_vi_[node.input[0]].type.tensor_type.elem_type
            q, v = self._get_sympy_shape(node, 0), self._get_sympy_shape(node, 2)
            heads, kv_heads = get_attribute(node, "q_num_heads"), get_attribute(node, "kv_num_heads")
            shape = [q[0], q[1], v[2] * heads // kv_heads]
            vi = self.known_vi_[node.output[0]]
            vi.CopyFrom(onnx.helper.make_tensor_value_info(node.output[0], dtype, get_shape_from_sympy_shape(shape)))
            self._propagate_shape_and_type(node, 3, 1)

        def _infer_causal_conv(self, node: onnx.NodeProto) -> None:
            # output: the input's shape; present_state: past_state's shape
            self._propagate_shape_and_type(node, 0, 0)
            self._propagate_shape_and_type(node, 3, 1)

        def _infer_selective_scan(self, node: onnx.NodeProto) -> None:
            # output: xdt's shape; present_state: past_state's shape
            self._propagate_shape_and_type(node, 0, 0)
            self._propagate_shape_and_type(node, 5, 1)

    for dims in ({}, _CONCRETE_DIMS):
        helper = Helper()
        try:
            if helper.infer(dims):
                return helper
        except Exception:  # sympy cannot decide a symbolic comparison: retry with sizes
            pass
    return None


def _rename(graph: onnx.GraphProto, producer: dict[str, str], original: set[str]) -> None:
    """Each fused node takes the scope of the node that produced its first output before
    (the norm's final Mul): /model/layers.3/ffn_norm/SkipSimplifiedLayerNormalization."""
    taken = {n.name for n in graph.node if n.name in original}
    for node in graph.node:
        if node.name in original or node.op_type not in FUSED_NORM_OPS:
            continue
        scope = _scope(producer.get(node.output[0], ""))
        base = f"{scope}/{node.op_type}" if scope else f"/{node.op_type}"
        name, count = base, 0
        while name in taken:
            count += 1
            name = f"{base}_{count}"
        node.name = name
        taken.add(name)


def _scope(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else ""


def _sort(graph: onnx.GraphProto, order: dict[str, int], producer: dict[str, str]) -> None:
    """Topological order that keeps the exporter's order: the passes append fused nodes at
    the end; each goes back where the norm it replaces was (the position of its final Mul)."""
    nodes = list(graph.node)
    key = [float(order.get(n.name, order.get(producer.get(n.output[0], ""), len(order)))) for n in nodes]
    made = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waiting = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        deps = {made[x] for x in n.input if x in made and made[x] != i}
        waiting[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [(key[i], i) for i in range(len(nodes)) if waiting[i] == 0]
    heapq.heapify(ready)
    out: list[onnx.NodeProto] = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(nodes[i])
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (key[u], u))
    if len(out) != len(nodes):
        raise RuntimeError("RMSNorm fusion left a cycle in the graph")
    del graph.node[:]
    graph.node.extend(out)


def _io(graph: onnx.GraphProto) -> list[bytes]:
    return [v.SerializeToString() for v in list(graph.input) + list(graph.output)]


def _quiet_optimizer_logs() -> None:
    # The passes print shape-inference chatter at WARNING ("symbolic shape inference disabled").
    # The shape inference logs a warning per comparison it cannot decide ("-seq + total_len < 0").
    for name in ("fusion_skiplayernorm", "onnx_model", "symbolic_shape_infer", "shape_infer_helper"):
        logging.getLogger(name).setLevel(logging.ERROR)


def pack_qkv(model: onnx.ModelProto) -> int:
    """One MatMul for the query, key and value projections of each GroupQueryAttention, in place.

    Where the node's query, key and value come from three MatMuls of one input by constant
    weights (each optionally plus a constant bias) and feed nothing else, the weights are
    concatenated into one [d, (h + 2 h_kv) hd] initializer, and the node takes the packed
    projection as its query with key and value left out (the operator's packed-QKV form). A
    decode step then runs one matrix product (one MatMulNBits once quantized) instead of
    three. Returns how many nodes were packed; projections of another shape (adapters added,
    a gate split off the query, per-head norms) are left as they are."""
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output if o}
    uses = Counter(i for n in graph.node for i in n.input if i)
    uses.update(o.name for o in graph.output)

    def projection(name: str) -> tuple[onnx.NodeProto, onnx.NodeProto | None, str] | None:
        """(MatMul, bias Add or None, X) when `name` is X @ W (+ b) used once."""
        node = producer.get(name)
        add = None
        if node is not None and node.op_type == "Add" and uses[name] == 1:
            bias = [i for i in node.input if i in inits]
            other = [i for i in node.input if i not in inits]
            if len(bias) != 1 or len(other) != 1:
                return None
            add, name, node = node, other[0], producer.get(other[0])
        if node is None or node.op_type != "MatMul" or uses[name] != 1 or node.input[1] not in inits:
            return None
        if len(inits[node.input[1]].dims) != 2:
            return None
        return node, add, node.input[0]

    packed = 0
    removed: set[str] = set()
    for gqa in [n for n in graph.node if n.op_type == "GroupQueryAttention"]:
        if len(gqa.input) < 3 or not all(gqa.input[:3]):
            continue
        parts = [projection(i) for i in gqa.input[:3]]
        if any(p is None for p in parts) or len({p[2] for p in parts if p}) != 1:
            continue
        found = [p for p in parts if p is not None]
        if len({a is None for _, a, _ in found}) != 1:
            continue  # bias on some projections only
        matmuls = [m for m, _, _ in found]
        weights = [numpy_helper.to_array(inits[m.input[1]]) for m in matmuls]
        base = matmuls[0].name.rsplit("/q_proj/", 1)[0] if "/q_proj/" in matmuls[0].name else matmuls[0].name
        w_name, out = f"{base}/qkv_proj.weight", f"{base}/qkv_proj/output"
        graph.initializer.append(numpy_helper.from_array(np.concatenate(weights, axis=1), w_name))
        new = [onnx.helper.make_node("MatMul", [found[0][2], w_name], [out], name=f"{base}/qkv_proj/MatMul")]
        if found[0][1] is not None:
            biases = [numpy_helper.to_array(inits[next(i for i in a.input if i in inits)]) for _, a, _ in found if a]
            b_name, product = f"{base}/qkv_proj.bias", f"{base}/qkv_proj/product"
            graph.initializer.append(numpy_helper.from_array(np.concatenate(biases), b_name))
            new[0].output[0] = product
            new.append(onnx.helper.make_node("Add", [product, b_name], [out], name=f"{base}/qkv_proj/Add"))
        nodes = list(graph.node)
        at = min(nodes.index(m) for m in matmuls)
        for node in reversed(new):
            graph.node.insert(at, node)
        for m, a, _ in found:
            graph.node.remove(m)
            removed.add(m.input[1])
            if a is not None:
                graph.node.remove(a)
                removed.update(i for i in a.input if i in inits)
        gqa.input[0], gqa.input[1], gqa.input[2] = out, "", ""
        packed += 1
    still = {i for n in graph.node for i in n.input}
    for t in [t for t in graph.initializer if t.name in removed and t.name not in still]:
        graph.initializer.remove(t)
    return packed


def expand_selective_scans(model: onnx.ModelProto) -> int:
    """Replace each SelectiveScan placeholder (models.ops) by an onnxruntime Scan, in place.

    The Mamba1 scan has d_inner channels, each with its own d_state-wide state and decay,
    h_t = exp(dt_t A) * h_{t-1} + B_t (dt x)_t, y_t = C_t h_t. onnxruntime has no operator for
    it: LinearAttention takes it as d_inner heads of one value each, and its per-head loop is
    slow. Measured per layer at jamba-125m's sizes, 2 threads (docs/notes/onnxruntime-fused-ops,
    mamba1_scan.py): 12.7 ms for 128 tokens and 363 ms for 1,900, against 2.2 and 34 ms for
    this Scan; one token 88 us against 27 us (21 us for the step as plain nodes, no Scan). So
    the scan is a Scan over the sequence whose body is the step on the state as the contract
    stores it, [b, n, H] with channels innermost (every product broadcasts along the long axis):

        h = exp(dt_t * A) * h + B_t^T (dt x)_t,   y_t = C_t h

    six nodes per token, with A a constant of the body. The Scan reads nothing from the outer
    graph but its inputs, so tools that order nodes or drop constants by top-level inputs
    alone (onnxruntime's quantizers do) keep it whole. Returns the number of scans."""
    import numpy as np
    from onnx import helper, numpy_helper

    from ..models.ops import SCAN_DOMAIN

    graph = model.graph
    scans = [n for n in graph.node if n.domain == SCAN_DOMAIN and n.op_type == "SelectiveScan"]
    if not scans:
        return 0
    f = onnx.TensorProto.FLOAT
    consts = {
        "/scan/axis2": np.array([2], np.int64),
        "/scan/axis3": np.array([3], np.int64),
        "/scan/packed": np.array([0, 0, -1], np.int64),
    }
    for node in scans:
        xdt, dt, A, B, C, h0 = node.input
        y, h1 = node.output
        scope = node.name.rsplit("/", 1)[0] if "/" in node.name else f"/scan_{scans.index(node)}"
        s = f"{scope}/scan"
        decay_rates = _constant(model, A).astype(np.float32)  # [n, H]
        body = helper.make_graph(
            [
                helper.make_node("Mul", ["dt", "A"], ["log_decay"], name=f"{s}/Mul"),
                helper.make_node("Exp", ["log_decay"], ["decay"], name=f"{s}/Exp"),
                helper.make_node("Mul", ["decay", "state"], ["kept"], name=f"{s}/Mul_1"),
                helper.make_node("Mul", ["key", "xdt"], ["written"], name=f"{s}/Mul_2"),
                helper.make_node("Add", ["kept", "written"], ["new_state"], name=f"{s}/Add"),
                helper.make_node("MatMul", ["query", "new_state"], ["y"], name=f"{s}/MatMul"),
            ],
            f"{s.strip('/').replace('/', '_')}_step",
            [
                helper.make_tensor_value_info("state", f, ["batch", "n", "H"]),
                helper.make_tensor_value_info("dt", f, ["batch", 1, "H"]),
                helper.make_tensor_value_info("xdt", f, ["batch", 1, "H"]),
                helper.make_tensor_value_info("key", f, ["batch", "n", 1]),
                helper.make_tensor_value_info("query", f, ["batch", 1, "n"]),
            ],
            [
                helper.make_tensor_value_info("new_state", f, ["batch", "n", "H"]),
                helper.make_tensor_value_info("y", f, ["batch", 1, "H"]),
            ],
            [numpy_helper.from_array(decay_rates, "A")],
        )
        per_token = [f"{s}/dt", f"{s}/xdt", f"{s}/key", f"{s}/query"]
        expanded = [
            helper.make_node("Unsqueeze", [dt, "/scan/axis2"], [per_token[0]], name=f"{s}/Unsqueeze"),
            helper.make_node("Unsqueeze", [xdt, "/scan/axis2"], [per_token[1]], name=f"{s}/Unsqueeze_1"),
            helper.make_node("Unsqueeze", [B, "/scan/axis3"], [per_token[2]], name=f"{s}/Unsqueeze_2"),
            helper.make_node("Unsqueeze", [C, "/scan/axis2"], [per_token[3]], name=f"{s}/Unsqueeze_3"),
            helper.make_node(
                "Scan",
                [h0, *per_token],
                [h1, f"{s}/y"],
                name=f"{scope}/SelectiveScan",
                body=body,
                num_scan_inputs=4,
                scan_input_axes=[1, 1, 1, 1],
                scan_output_axes=[1],
            ),
            helper.make_node("Reshape", [f"{s}/y", "/scan/packed"], [y], name=f"{s}/Reshape"),
        ]
        at = list(graph.node).index(node)
        graph.node.remove(node)
        for n in reversed(expanded):
            graph.node.insert(at, n)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    _drop_dead(graph)
    kept = [o for o in model.opset_import if o.domain != SCAN_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return len(scans)


def _constant(model: onnx.ModelProto, name: str) -> Any:
    """The value of `name`, computed from initializers alone (onnx's reference evaluator runs
    the nodes it depends on); an error if it depends on a graph input."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    if name in inits:
        return numpy_helper.to_array(inits[name])
    producer = {o: n for n in graph.node for o in n.output if o}
    needed, todo, leaves = [], [name], set()
    while todo:
        value = todo.pop()
        if value in inits:
            leaves.add(value)
            continue
        node = producer.get(value)
        if node is None:
            raise RuntimeError(f"{name} depends on the graph input {value}, not on weights alone")
        if node not in needed:
            needed.append(node)
            todo.extend(i for i in node.input if i)
    order = {id(n): i for i, n in enumerate(graph.node)}
    needed.sort(key=lambda n: order[id(n)])
    sub = onnx.helper.make_graph(
        needed,
        "constant",
        [],
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)],
        [inits[leaf] for leaf in sorted(leaves)],
    )
    values: list[Any] = list(
        ReferenceEvaluator(onnx.helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})
    )
    return values[0]


def _drop_dead(graph: onnx.GraphProto) -> None:
    """Nodes and initializers nothing reads any more (after a rewrite took their reader)."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {i for n in graph.node for i in n.input} | outputs
        dead = [n for n in graph.node if not any(o in read for o in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    for tensor in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(tensor)
