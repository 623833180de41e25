"""Edits of ONNX graphs, in one place: walking nodes (subgraphs included), what a node reads,
removing what nothing reads, ordering, and computing a weight-only value.

Export (composing fragments, fusing norms, expanding op placeholders), quantization (its
rewrites around onnxruntime's quantizers) and the loader's compatibility rewrites all edit
graphs through these; none keeps its own pruner or walker. Importing it imports nothing but
the standard library (the loader's rewrites run in the Lambda image, which has no `onnx`);
the graphs are onnx's protobuf objects.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx


def walk(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph`, each followed by the nodes of its subgraphs (an If's branches, a
    Scan's body), depth first."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                yield from walk(sub)


def node_reads(node: onnx.NodeProto) -> set[str]:
    """The values a node reads: its inputs, and the outer-scope names its subgraphs read."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for sub in _subgraphs(attr):
            inner = {o for n in sub.node for o in n.output} | {t.name for t in sub.initializer}
            inner |= {i.name for i in sub.input}
            names |= {i for n in sub.node for i in node_reads(n) if i not in inner}
    return names


def graph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every value some node of `graph` reads (subgraphs included), and the graph's outputs."""
    return {i for n in graph.node for i in node_reads(n)} | {o.name for o in graph.output}


def subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every name read anywhere inside the subgraphs of `graph`'s nodes (their own values
    included)."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                for inner in sub.node:
                    names.update(inner.input)
                names |= subgraph_reads(sub)
    return names


def prune(graph: onnx.GraphProto, initializers: bool = False) -> int:
    """Remove the nodes whose outputs nothing reads, repeatedly (what fed only them goes too),
    keeping the order of the rest; with `initializers`, also the initializers nothing reads.
    Returns how many nodes went."""
    removed = 0
    while True:
        read = graph_reads(graph)
        kept = [n for n in graph.node if any(o in read for o in n.output)]
        if len(kept) == len(graph.node):
            break
        removed += len(graph.node) - len(kept)
        del graph.node[:]
        graph.node.extend(kept)
    if initializers:
        unread = [t for t in graph.initializer if t.name not in read]
        for tensor in unread:
            graph.initializer.remove(tensor)
    return removed


def live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """The nodes `outputs` depend on, in their given order."""
    made = {o: n for n in nodes for o in n.output if o}
    alive: set[int] = set()
    todo = [made[o] for o in outputs if o in made]
    while todo:
        node = todo.pop()
        if id(node) in alive:
            continue
        alive.add(id(node))
        todo += [made[i] for i in node_reads(node) if i in made]
    return [n for n in nodes if id(n) in alive]


def toposort(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Kahn's order, stable in the given order: a node moves only behind what it reads."""
    made = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waiting = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        deps = {made[x] for x in node_reads(n) if x in made and made[x] != i}
        waiting[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [i for i in range(len(nodes)) if waiting[i] == 0]
    heapq.heapify(ready)
    out: list[onnx.NodeProto] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(nodes[i])
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(out) != len(nodes):
        raise ValueError("the graph has a cycle")
    return out


def constant_value(model: onnx.ModelProto, name: str) -> Any:
    """The value of `name`, computed from initializers alone (onnx's reference evaluator runs
    the nodes it depends on); an error if it depends on a graph input."""
    import onnx
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
            raise ValueError(f"{name} depends on the graph input {value}, not on weights alone")
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


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == attr.GRAPH:
        return [attr.g]
    if attr.type == attr.GRAPHS:
        return list(attr.graphs)
    return []
