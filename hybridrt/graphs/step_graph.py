"""The one-token decode graph: what captured decode steps run when the graph holds a Scan.

onnxruntime captures no session that holds a control-flow node (measured on an H200: every
Mamba1 graph was refused, its selective scan being an ONNX Scan over the tokens). A decode step
feeds one token, so each Scan runs its body once: `inline_scans` replaces the Scan by the body's
nodes applied to that token (the scan inputs' token axis squeezed away, the scan outputs'
put back), and fixes input_ids to one token so that onnxruntime refuses any other length. For
selective_scan's body this is the step that models/ops/selective_scan.py measured at 21 us as
plain nodes against 27 us for the Scan at one token.

`split_for_capture` gives the graph the loader opens for captured steps when the graph has a
Scan: the capture rewrite (compat.capture_inputs: lengths and positions as inputs) and the
scans inlined. The loader keeps the graph as it is for prompts (uncaptured), and shares the
weights between the two sessions (runtime/decode_session.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import GraphError
from .compat import capture_inputs, drop_query_seqlens
from .edit import node_reads, prune, walk

CONTROL_FLOW = ("Scan", "Loop", "If")


def control_flow(model: Any) -> list[str]:
    """The names of the control-flow nodes anywhere in the model (subgraphs included)."""
    return [n.name or n.op_type for n in walk(model.graph) if n.op_type in CONTROL_FLOW]


def split_for_capture(
    model: Any, graph: Path, query_seqlens: bool, share: bool
) -> tuple[bytes, bytes, tuple[str, ...], dict[str, Any]]:
    """From the graph file `graph`'s model (consumed): the bytes of the graph for prompts (as
    it is, without query_seqlens unless `query_seqlens`), those of the one-token graph for
    captured steps (compat.capture_inputs, then inline_scans), the inputs the latter adds, and
    with `share` the weights both graphs were detached from (detach_weights), to be given to
    both sessions."""
    arrays = detach_weights(model, graph.parent, graph.name) if share else {}
    if not query_seqlens:
        drop_query_seqlens(model)
    prompts = model.SerializeToString()
    inputs = capture_inputs(model, query_seqlens)
    inline_scans(model)
    return prompts, model.SerializeToString(), inputs, arrays


def inline_scans(model: Any) -> int:
    """Replace each top-level Scan by its body's nodes for one iteration, in place, and fix
    input_ids to one token. Valid for one-token calls only. Returns the number of Scans."""
    graph = model.graph
    scans = [n for n in graph.node if n.op_type == "Scan"]
    for index, node in enumerate(scans):
        prefix = f"{node.name or f'/scan_{index}'}/step"
        nodes, initializers = _one_iteration(node, prefix)
        at = list(graph.node).index(node)
        graph.node.remove(node)
        for n in reversed(nodes):
            graph.node.insert(at, n)
        graph.initializer.extend(initializers)
    if scans:
        _one_token(graph)
        prune(graph, initializers=True)
    return len(scans)


def _one_iteration(node: Any, prefix: str) -> tuple[list[Any], list[Any]]:
    """The nodes and initializers that compute a Scan's outputs when its sequence has one
    element: the body's nodes and constants renamed under `prefix`, reading the Scan's state
    inputs and its scan inputs with the scanned axis squeezed away."""
    from onnx import TensorProto, helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body, scanned = attrs["body"], attrs["num_scan_inputs"]
    states = len(node.input) - scanned
    in_axes = list(attrs.get("scan_input_axes", [0] * scanned))
    out_axes = list(attrs.get("scan_output_axes", [0] * (len(node.output) - states)))
    if any(a.type in (a.GRAPH, a.GRAPHS) for n in body.node for a in n.attribute):
        raise GraphError(f"{node.name}: a Scan whose body holds subgraphs cannot be inlined")
    names = {b.name: outer for b, outer in zip(body.input[:states], node.input[:states])}
    out: list[Any] = []
    axes: dict[int, str] = {}

    def axis(a: int) -> str:
        return axes.setdefault(a, f"{prefix}/axis{a}".replace("-", "m"))

    for b, outer, a in zip(body.input[states:], node.input[states:], in_axes):
        names[b.name] = f"{prefix}/{b.name}"
        out.append(helper.make_node("Squeeze", [outer, axis(a)], [names[b.name]], name=f"{prefix}/Squeeze_{b.name}"))
    initializers = []
    for tensor in body.initializer:
        names[tensor.name] = f"{prefix}/{tensor.name}"
        copy = type(tensor)()
        copy.CopyFrom(tensor)
        copy.name = names[tensor.name]
        initializers.append(copy)
    out += _renamed(body, names, node.output[:states], prefix)
    for b, outer, a in zip(body.output[states:], node.output[states:], out_axes):
        out.append(
            helper.make_node("Unsqueeze", [names[b.name], axis(a)], [outer], name=f"{prefix}/Unsqueeze_{b.name}")
        )
    initializers += [helper.make_tensor(name, TensorProto.INT64, [1], [a]) for a, name in axes.items()]
    return out, initializers


def _renamed(body: Any, names: dict[str, str], state_outputs: Any, prefix: str) -> list[Any]:
    """The body's nodes with their values renamed (`names` grows): a state output takes the
    Scan's own output name (through an Identity where the body passes a value through)."""
    from onnx import helper

    made = {o for n in body.node for o in n.output}
    passed = []
    for b, outer in zip(body.output, state_outputs):
        if b.name in made:
            names[b.name] = outer
        else:
            passed.append((b.name, outer))
    nodes = []
    for n in body.node:
        copy = type(n)()
        copy.CopyFrom(n)
        copy.name = f"{prefix}/{n.name or n.op_type}"
        for i, x in enumerate(copy.input):
            copy.input[i] = names.get(x, x)  # a name from outside the body stays
        for i, x in enumerate(copy.output):
            if x:
                copy.output[i] = names.setdefault(x, f"{prefix}/{x}")
        nodes.append(copy)
    for value, outer in passed:
        nodes.append(
            helper.make_node("Identity", [names.get(value, value)], [outer], name=f"{prefix}/Identity_{value}")
        )
    return nodes


def _one_token(graph: Any) -> None:
    for value in graph.input:
        if value.name == "input_ids":
            dims = value.type.tensor_type.shape.dim
            dims[1].Clear()
            dims[1].dim_value = 1


def quantized_weights(model: Any) -> bool:
    """Whether the model holds weights of 8 bits or fewer (int8, int4: a quantized graph)."""
    from onnx import TensorProto

    small = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4)
    return any(t.data_type in small for t in model.graph.initializer)


def detach_weights(model: Any, directory: Path, graph_file: str, min_bytes: int = 1024) -> dict[str, Any]:
    """Move each initializer of at least `min_bytes` out of the model, in place, for sessions
    that are given the returned arrays (name -> numpy array: a copy of an embedded tensor, a
    read-only map of an external data file). What stays in the model refers to a position
    past the end of `graph_file`, so a session that read it instead of the given array fails
    rather than runs on other bytes. onnxruntime's optimizers read some weights from the graph
    itself, and those stay: the inputs of nodes that read nothing but weights (constant folding
    computes them at load: a Reshape of int4 scales, a DequantizeLinear of int8 weights) and
    float16 weights (the CPU provider casts them to float32 at load)."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    weights = {t.name for t in model.graph.initializer}
    folded = {i for n in model.graph.node if (reads := node_reads(n)) <= weights for i in reads}
    arrays: dict[str, Any] = {}
    for tensor in model.graph.initializer:
        if tensor.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) or tensor.name in folded:
            continue
        if tensor.data_location == TensorProto.EXTERNAL:
            where = {e.key: e.value for e in tensor.external_data}
            dtype = numpy_helper.helper.tensor_dtype_to_np_dtype(tensor.data_type)
            offset = int(where.get("offset", 0))
            arrays[tensor.name] = np.memmap(directory / where["location"], dtype, "r", offset, tuple(tensor.dims))
        elif tensor.HasField("raw_data") and len(tensor.raw_data) >= min_bytes:
            arrays[tensor.name] = numpy_helper.to_array(tensor)
        else:
            continue
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", graph_file), ("offset", str(1 << 50)), ("length", "1")):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    return arrays
