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

import functools
import heapq
import logging
from collections import Counter
from collections.abc import Callable
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
    # The pass appends its nodes; symbolic shape inference does not reorder a graph that
    # outputs an initializer (the outer graph of a streamed export outputs its rotary tables).
    onnx_model.topological_sort()
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
    """The Skip pass with a shape-inference helper that knows the fused ops' nodes (models.ops
    shape_rules: com.microsoft LinearAttention and CausalConvWithState, SelectiveScan;
    onnxruntime's symbolic shape inference stops at them, and the pass then fuses nothing after
    them)."""
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

    from ..models.ops import shape_rules

    class Helper(SymbolicShapeInferenceHelper):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(model)
            for op_type, rule in shape_rules().items():
                self.dispatcher_[op_type] = functools.partial(rule, self)

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
    """Replace the fused ops' export-time placeholders by the operators that run them, in place
    (each op's `expand`, models.ops): each Mamba1 SelectiveScan becomes an onnxruntime Scan
    (models.ops.selective_scan.expand_scans), the only placeholder there is. Returns the count."""
    from ..models.ops import expand_placeholders

    return expand_placeholders(model)


def fold_scales(model: onnx.ModelProto, owned: Callable[[str], bool] = lambda name: True) -> int:
    """Fold constant multipliers on a projection's output into its weight, in place.

    Where Mul(X @ W (+ b), c) has c a constant scalar or per-output-channel vector [N] and
    X @ W (+ b) feeds nothing else, W (and b) take the factor and the Mul goes: Granite's
    residual_multiplier on every block's two output projections, Falcon-H1's muP multipliers
    on in_proj and the MLP's gate. Quantized, the product needs no node of its own (a
    MatMulNBits cannot scale its output). `owned(name)` says whether a weight is this graph's
    alone to change (a weight several layers share is not). Returns how many Muls went."""
    import numpy as np
    from onnx import numpy_helper

    from ..graphs.edit import node_reads

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consts = {n.output[0]: n for n in graph.node if n.op_type == "Constant" and len(n.attribute) == 1}
    producer = {o: n for n in graph.node for o in n.output if o}
    # An If's branches may read a product from the outer graph: those reads count too.
    uses = Counter(i for n in graph.node for i in node_reads(n) if i)
    uses.update(o.name for o in graph.output)

    def constant(name: str) -> Any:
        if name in inits:
            return numpy_helper.to_array(inits[name])
        node = consts.get(name)
        if node is not None and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def folded(name: str, value: Any) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(numpy_helper.to_array(inits[name]).dtype), name))

    done = 0
    for mul in [n for n in graph.node if n.op_type == "Mul"]:
        for side in (0, 1):
            c, x = constant(mul.input[1 - side]), mul.input[side]
            if c is None or c.dtype != np.float32 or uses[x] != 1 or x not in producer:
                continue
            add, node = None, producer[x]
            if node.op_type == "Add":
                bias = [i for i in node.input if i in inits]
                other = [i for i in node.input if i not in inits]
                if len(bias) != 1 or len(other) != 1 or uses[other[0]] != 1 or other[0] not in producer:
                    continue
                add, node = node, producer[other[0]]
            if node.op_type != "MatMul" or node.input[1] not in inits or uses[node.input[1]] != 1:
                continue
            w = numpy_helper.to_array(inits[node.input[1]])
            b_name = next((i for i in add.input if i in inits), None) if add is not None else None
            names = [node.input[1]] + ([b_name] if b_name else [])
            if w.ndim != 2 or not all(owned(n) for n in names) or (b_name and uses[b_name] != 1):
                continue
            if c.size != 1 and (c.size != w.shape[1] or c.shape[-1] != w.shape[1]):
                continue  # one factor for all, or one per output channel: nothing else
            factor = c.reshape(-1) if c.size != 1 else c.reshape(())
            folded(node.input[1], w * factor)
            if b_name:
                folded(b_name, numpy_helper.to_array(inits[b_name]) * factor)
            producer[x].output[0] = mul.output[0]  # x fed only the Mul: its output is the product now
            producer[mul.output[0]] = producer.pop(x)
            graph.node.remove(mul)
            done += 1
            break
    if done:
        from ..graphs.edit import prune

        prune(graph, initializers=True)
        made = {o for n in graph.node for o in n.output}
        for v in [v for v in graph.value_info if v.name not in made]:
            graph.value_info.remove(v)
    return done
