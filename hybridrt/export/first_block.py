"""Layer 0's template made from a later layer's instead of traced (fragments.py traces one
template per distinct layer; layer 0 differs from the rest only in having no previous block's
output to add, so where a later layer has its signature, a graph edit gives layer 0's template)."""

from __future__ import annotations

import onnx

from .fragments import Template


def first_from(groups: dict[tuple[object, ...], list[int]]) -> int | None:
    """The layer whose template layer 0's is made from (first_layer): the first of the group
    with layer 0's signature but for being first; None if no later layer has it."""
    sig = next((s for s, members in groups.items() if members[0] == 0), None)
    if sig is None:
        return None
    later = groups.get((*sig[:2], False, *sig[3:]))
    return later[0] if later else None


def first_layer(template: Template) -> Template | None:
    """Layer 0's template from that of a later layer with the same signature but for being
    first. A later layer's graph begins with Add(x, r), the previous block's output joining the
    stream, and layer 0 has no r: without that Add, the stream read where the sum was (and an
    Identity where the sum was an output), it is the graph tracing layer 0 gives. A trace takes
    seconds, this edit milliseconds. None if the graph does not begin that way."""
    from ..graphs.edit import walk

    readers = [n for n in walk(template.model.graph) if "r" in n.input]
    if len(readers) != 1 or readers[0].op_type != "Add" or sorted(readers[0].input) != ["r", "x"]:
        return None
    total = readers[0].output[0]
    model = onnx.ModelProto()
    model.CopyFrom(template.model)
    graph = model.graph
    removed = next(n.name for n in graph.node if n.op_type == "Add" and list(n.output) == [total])
    nodes = [n for n in graph.node if n.name != removed]
    for node in nodes:  # the names _name_nodes would have given: later Adds of the scope move up one
        base, _, count = node.name.rpartition("_")
        if base == removed and count.isdigit():
            node.name = base if count == "1" else f"{base}_{int(count) - 1}"
    for node in walk(graph):
        node.input[:] = ["x" if i == total else i for i in node.input]
    if total in {v.name for v in graph.output}:
        nodes.append(onnx.helper.make_node("Identity", ["x"], [total], name=f"/model/layers.{template.index}/Identity"))
    del graph.node[:]
    graph.node.extend(nodes)
    for field_ in (graph.input, graph.value_info):
        keep = [v for v in field_ if v.name not in ("r", total)]
        del field_[:]
        field_.extend(keep)
    return Template(template.index, model, list(template.weights))
