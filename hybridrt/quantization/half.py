"""float16 mode: onnxruntime.transformers' float16 converter over a hybridrt graph, with the
operators that carry states, the norms and the dt path kept float32, the states read and
written in place, and the converter's redundant casts dropped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import QuantizationError
from ..graphs.contract import present_name
from .methods import quiet

# float16 mode: the operators that keep float32. The ops that carry a state from call to call
# (the KV buffers GroupQueryAttention writes in place, the conv and SSM states of
# CausalConvWithState, LinearAttention and the Mamba1 Scan), the dt path's Softplus and the
# norms, whose float32 residual stream keeps the sum of many layers exact: the rest (the
# matrix products, their weights, the activations between them) runs in float16. Graph inputs
# and outputs keep their types, so the states, the logits and the runtime do not change.
FLOAT32_OPS = (
    "GroupQueryAttention",
    "CausalConvWithState",
    "LinearAttention",
    "Scan",
    "Softplus",
    "Exp",
    "Softmax",
    "ReduceMax",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "LayerNormalization",
    "SkipLayerNormalization",
)


def float16(model: Any, keep: tuple[str, ...] = FLOAT32_OPS, half_kv: Sequence[str] = ()) -> tuple[Any, list[str]]:
    """The graph with float16 weights and products (onnxruntime.transformers.float16), and the
    names of the nodes whose weights are now float16.

    `half_kv` (the KV buffers' past names) runs attention in float16 too: GroupQueryAttention
    reads float16 q, k, v and keeps its past/present buffers in float16, graph inputs and
    outputs included (what onnxruntime's CUDA kernel, float16 and bfloat16 only, takes).

    The converter places its casts from the types ONNX shape inference gives each tensor; that
    inference runs on the graph without its weights (a model over 2 GB cannot be inferred in
    memory), and its value types are handed to the converter."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    _declare_types(model)
    if half_kv:
        keep = tuple(op for op in keep if op != "GroupQueryAttention")
    with quiet():
        converted = convert_float_to_float16(
            model, keep_io_types=True, op_block_list=list(keep), disable_shape_infer=True
        )
    if half_kv:
        _half_io(converted.graph, {*half_kv, *(present_name(n) for n in half_kv)})
    _drop_repeated_casts(converted.graph)
    _fold_round_trips(converted.graph)
    half = {t.name for t in converted.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16}
    nodes = [n.name for n in converted.graph.node if any(i in half for i in n.input)]
    return converted, nodes


def _declare_types(model: Any) -> None:
    """Every tensor's type as ONNX shape inference gives it, declared in the graph's value_info
    (the converter places its casts from them). The inference runs on the graph without its
    weights (a model over 2 GB cannot be inferred in memory)."""
    import onnx

    graph = model.graph
    # ONNX's inference does not know onnxruntime's own operators (com.microsoft, and
    # SimplifiedLayerNormalization): their outputs (all float in a float graph) are declared
    # first, so that the types reach every tensor after them; a tensor left untyped is left
    # uncast by the converter (a float32 tensor into a float16 Add, e.g.
    # SkipSimplifiedLayerNormalization's residual sum).
    typed = {v.name for v in graph.value_info} | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        if not onnx.defs.has(node.op_type, node.domain):
            for name in node.output:
                if name and name not in typed:
                    graph.value_info.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
                    typed.add(name)
    bare = onnx.helper.make_model(
        onnx.helper.make_graph(
            graph.node,
            graph.name,
            [
                *graph.input,
                *(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in graph.initializer),
            ],
            graph.output,
            value_info=graph.value_info,
        ),
        opset_imports=model.opset_import,
    )
    bare.ir_version = model.ir_version
    try:
        inferred = onnx.shape_inference.infer_shapes(bare)
    except Exception as exc:
        raise QuantizationError(f"float16: ONNX shape inference failed on the graph ({exc}); re-export it") from None
    known = {v.name for v in graph.value_info}
    graph.value_info.extend(v for v in inferred.graph.value_info if v.name not in known)


def _half_io(graph: Any, names: set[str]) -> None:
    """Graph inputs and outputs `names` become float16: the converter kept them float32 with a
    cast beside each (keep_io_types), which is dropped, so that the operator reads and writes
    the graph's own buffer (GroupQueryAttention's KV, in place)."""
    import onnx

    float16 = onnx.TensorProto.FLOAT16
    found = {v.name for v in (*graph.input, *graph.output)} & names
    if found != names:
        raise QuantizationError(f"float16 KV: the graph lacks {', '.join(sorted(names - found))}; re-export it")
    renames: dict[str, str] = {}
    dropped: set[int] = set()  # node indices (protobuf's wrappers are not kept alive for id())
    for k, node in enumerate(graph.node):
        if node.op_type != "Cast":
            continue
        if node.input[0] in names:  # past (float32 input) -> float16: read the input itself
            renames[node.output[0]] = node.input[0]
            dropped.add(k)
        elif node.output[0] in names:  # float16 -> present (float32 output): write the output
            renames[node.input[0]] = node.output[0]
            dropped.add(k)
    kept = [n for k, n in enumerate(graph.node) if k not in dropped]
    for node in kept:
        node.input[:] = [renames.get(i, i) for i in node.input]
        node.output[:] = [renames.get(o, o) for o in node.output]
    del graph.node[:]
    graph.node.extend(kept)
    for info in (*graph.input, *graph.output):
        if info.name in names:
            info.type.tensor_type.elem_type = float16
    for info in list(graph.value_info):
        if info.name in renames:
            graph.value_info.remove(info)


def _drop_repeated_casts(graph: Any) -> None:
    """The converter casts a float16 tensor back to float32 once per float32 consumer, each
    cast with the same name and output: one is kept."""
    seen: set[bytes] = set()
    kept = []
    for node in graph.node:
        key = node.SerializeToString(deterministic=True) if node.op_type == "Cast" else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        kept.append(node)
    if len(kept) < len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def _fold_round_trips(graph: Any) -> None:
    """The converter passes a float32 tensor between two float32 operators (a state into the
    scan, the scan's new state out to the graph, the residual sum between two norms) through
    float16 and back: Cast(to=float) of Cast(to=float16) of X. Each such pair is folded, so the
    float32 operators read X itself: states and the residual stream stay float32 exactly, and
    a state's operator reads and writes the graph's own input and output (in place)."""
    import onnx

    float32, float16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    outputs = {o.name for o in graph.output}
    inputs = {i.name for i in graph.input}

    def to(node: Any) -> int | None:
        return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None

    producer = {o: n for n in graph.node for o in n.output}
    dropped: set[int] = set()
    renames: dict[str, str] = {}
    for node in graph.node:
        first = producer.get(node.input[0]) if to(node) == float32 else None
        if first is None or to(first) != float16:
            continue
        x, y = first.input[0], node.output[0]
        if y in outputs:
            if x in inputs or x in outputs:
                continue  # a graph input straight to an output: keep the copy
            renames[x] = y  # X's producer writes the graph's output itself
        else:
            renames[y] = x
        dropped.add(id(node))
    if not renames:
        return

    def name(n: str) -> str:
        while n in renames:
            n = renames[n]
        return n

    kept = [n for n in graph.node if id(n) not in dropped]
    for node in kept:
        node.input[:] = [name(i) for i in node.input]
        node.output[:] = [name(o) if o in renames and renames[o] in outputs else o for o in node.output]
    for info in graph.value_info:
        if info.name in renames and renames[info.name] in outputs:
            info.name = renames[info.name]
    used = {i for n in kept for i in n.input} | outputs
    while True:  # casts nothing reads any more
        dead = [n for n in kept if n.op_type == "Cast" and not set(n.output) & used]
        if not dead:
            break
        kept = [n for n in kept if n not in dead]
        used = {i for n in kept for i in n.input} | outputs
    del graph.node[:]
    graph.node.extend(kept)
