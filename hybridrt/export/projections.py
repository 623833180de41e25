"""Rewrites of each layer's graph once its weights are bound (export.streamed): its query, key
and value projections packed into one (`pack_qkv`), constant multipliers folded into the
projection they scale (`fold_scales`), and the fused ops' placeholders expanded into the
operators that run them (`expand_selective_scans`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import onnx


def pack_qkv(model: onnx.ModelProto) -> int:
    """One MatMul for the query, key and value projections of each GroupQueryAttention, in place.

    Where the node's query, key and value come from three MatMuls of one input by constant
    weights (each optionally plus a constant bias) and feed nothing else, the weights are
    concatenated into one [d, (h + 2 h_kv) hd] initializer, and the node takes the packed
    projection as its query with key and value left out (the operator's packed-QKV form). A
    decode step then runs one matrix product (one MatMulNBits once quantized) instead of
    three. Returns how many nodes were packed; projections of another shape (adapters added,
    a gate split off the query, per-head norms) are left as they are."""

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output if o}
    uses = Counter(i for n in graph.node for i in n.input if i)
    uses.update(o.name for o in graph.output)

    packed = 0
    removed: set[str] = set()
    for gqa in [n for n in graph.node if n.op_type == "GroupQueryAttention"]:
        if len(gqa.input) < 3 or not all(gqa.input[:3]):
            continue
        parts = [_projection(i, producer, uses, inits) for i in gqa.input[:3]]
        if any(p is None for p in parts) or len({p[2] for p in parts if p}) != 1:
            continue
        found = [p for p in parts if p is not None]
        if len({a is None for _, a, _ in found}) != 1:
            continue  # bias on some projections only
        matmuls = [m for m, _, _ in found]
        new, out = _packed(graph, found, inits)
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


Projection = tuple[onnx.NodeProto, onnx.NodeProto | None, str]  # (MatMul, bias Add or None, its input X)


def _projection(
    name: str, producer: dict[str, onnx.NodeProto], uses: Counter[str], inits: dict[str, onnx.TensorProto]
) -> Projection | None:
    """(MatMul, bias Add or None, X) when value `name` is X @ W (+ b) by constants, used once."""
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


def _packed(
    graph: onnx.GraphProto, found: list[Projection], inits: dict[str, onnx.TensorProto]
) -> tuple[list[onnx.NodeProto], str]:
    """The packed projection of query, key and value (`found`): its nodes (a MatMul, and an Add
    where they have biases) and its output; its concatenated weights are added to the graph."""
    import numpy as np
    from onnx import numpy_helper

    first = found[0][0]
    weights = [numpy_helper.to_array(inits[m.input[1]]) for m, _, _ in found]
    base = first.name.rsplit("/q_proj/", 1)[0] if "/q_proj/" in first.name else first.name
    w_name, out = f"{base}/qkv_proj.weight", f"{base}/qkv_proj/output"
    graph.initializer.append(numpy_helper.from_array(np.concatenate(weights, axis=1), w_name))
    new = [onnx.helper.make_node("MatMul", [found[0][2], w_name], [out], name=f"{base}/qkv_proj/MatMul")]
    if found[0][1] is not None:
        biases = [numpy_helper.to_array(inits[next(i for i in a.input if i in inits)]) for _, a, _ in found if a]
        b_name, product = f"{base}/qkv_proj.bias", f"{base}/qkv_proj/product"
        graph.initializer.append(numpy_helper.from_array(np.concatenate(biases), b_name))
        new[0].output[0] = product
        new.append(onnx.helper.make_node("Add", [product, b_name], [out], name=f"{base}/qkv_proj/Add"))
    return new, out


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

    done = 0
    for mul in [n for n in graph.node if n.op_type == "Mul"]:
        for side in (0, 1):
            c, x = _constant(mul.input[1 - side], inits, consts), mul.input[side]
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
            _scaled(inits[node.input[1]], factor)
            if b_name:
                _scaled(inits[b_name], factor)
            producer[x].output[0] = mul.output[0]  # x fed only the Mul: its output is the product now
            producer[mul.output[0]] = producer.pop(x)
            graph.node.remove(mul)
            done += 1
            break
    if done:
        _pruned(graph)
    return done


def _constant(name: str, inits: dict[str, onnx.TensorProto], consts: dict[str, onnx.NodeProto]) -> Any:
    """Value `name` as an array where it is an initializer or a Constant node's, else None."""
    from onnx import numpy_helper

    if name in inits:
        return numpy_helper.to_array(inits[name])
    node = consts.get(name)
    if node is not None and node.attribute[0].name == "value":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def _scaled(weight: onnx.TensorProto, factor: Any) -> None:
    """`weight` times `factor`, in place, in its own dtype."""
    from onnx import numpy_helper

    value = numpy_helper.to_array(weight)
    weight.CopyFrom(numpy_helper.from_array((value * factor).astype(value.dtype), weight.name))


def _pruned(graph: onnx.GraphProto) -> None:
    """What the folded Muls left unused removed: nodes, initializers, their value infos."""
    from ..graphs.edit import prune

    prune(graph, initializers=True)
    made = {o for n in graph.node for o in n.output}
    for v in [v for v in graph.value_info if v.name not in made]:
        graph.value_info.remove(v)
