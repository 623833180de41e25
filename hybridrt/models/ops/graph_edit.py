"""Edits of an exported ONNX graph that an op's placeholder expansion needs."""

from __future__ import annotations

from typing import Any

import onnx


def constant_value(model: onnx.ModelProto, name: str) -> Any:
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


def drop_dead(graph: onnx.GraphProto) -> None:
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
