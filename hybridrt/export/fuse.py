"""RMSNorm fusion of an exported ONNX graph with onnxruntime.transformers' own passes (the
hybrid-specific rewrites of each layer that follow are export.projections').

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
