"""Instantiate the traced templates (fragments.py) once per layer and write one graph.

A template is split once into its weight part (the nodes that read only weights and
constants: transposes of Linear weights, -exp(A_log), repeats for grouped heads) and its
run-time part. Per layer, onnx's reference evaluator runs the weight part on that layer's
tensors, the results become the layer's initializers, the run-time part is copied under the
layer's names (/model/layers.{i}/...), the passes that need weight values run on that one
layer (export.projections.pack_qkv, expand_selective_scans, direct quantization), and the layer's
initializers go straight to the data file. Memory holds one layer's weights at a time and the
nodes of the graph, never the whole model's values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graphs.contract import GraphContract, TensorSpec
from ..graphs.edit import live, node_reads, toposort
from .fragments import WEIGHT, Template

STANDARD = ("", "ai.onnx")
MICROSOFT = "com.microsoft"
ALIGN = 4096  # data file offsets of tensors of at least this size (page-aligned: mmap-friendly)


@dataclass
class Prepared:
    """A template split into its weight part (an evaluator) and its run-time part."""

    template: Template
    runtime: list[onnx.NodeProto]
    constants: list[onnx.TensorProto]  # the template's own initializers the run-time part reads
    boundary: list[str]  # weight-part values the run-time part reads (w:<name> inputs included)
    evaluator: Any  # onnx.reference.ReferenceEvaluator of the weight part, or None
    weight_inputs: list[str]  # inputs of the evaluator (w:<name>)
    names: dict[str, str]  # boundary value -> initializer name pattern ({i} the layer)
    opsets: list[onnx.OperatorSetIdProto] = field(default_factory=list)
    value_info: list[onnx.ValueInfoProto] = field(default_factory=list)  # of run-time values


def prepare(template: Template, layer_weight: Callable[[str], str], fused: bool = True) -> Prepared:
    """Split `template` (after any fusion) into its weight and run-time parts. `layer_weight`
    maps a template weight name to its name pattern, '{i}' standing for the layer; `fused`
    lets the run-time part use onnxruntime's contrib operators (_transposed_reads)."""
    from onnx.reference import ReferenceEvaluator

    graph = template.model.graph
    inits = {t.name: t for t in graph.initializer}
    weight_nodes, runtime = _split(graph, inits, set())
    # A weight read as it is (a tied embedding's table) keeps its Transpose at run time rather
    # than a transposed copy beside it: one table in the file, which quantization sees as tied.
    direct = {i for n in runtime for i in n.input if i.startswith(WEIGHT)}
    if direct:
        weight_nodes, runtime = _split(graph, inits, direct)
        runtime = _transposed_reads(runtime, direct) if fused else runtime
    read = {i for n in runtime for i in n.input if i} | {o.name for o in graph.output}
    made = {o for n in weight_nodes for o in n.output if o}
    weighted = _weight_ancestors(weight_nodes)
    boundary = [v for v in _ordered(graph, weight_nodes) if v in read and (v in made or v.startswith(WEIGHT))]
    constants = [inits[v] for v in sorted(read & set(inits) - made)]
    weight_inputs = sorted({i for n in weight_nodes for i in n.input if i.startswith(WEIGHT)})
    evaluator = None
    outs = [v for v in boundary if v in made]
    if outs:
        sub = helper.make_graph(
            weight_nodes,
            "weights",
            [helper.make_tensor_value_info(w, onnx.TensorProto.FLOAT, None) for w in weight_inputs],
            [helper.make_tensor_value_info(v, onnx.TensorProto.UNDEFINED, None) for v in outs],
            [inits[i] for i in sorted({i for n in weight_nodes for i in n.input} & set(inits))],
        )
        evaluator = ReferenceEvaluator(helper.make_model(sub, opset_imports=template.model.opset_import))
    names = _boundary_names(boundary, weighted, layer_weight)
    produced = {o for n in runtime for o in n.output}
    info = [v for v in graph.value_info if v.name in produced]
    opsets = list(template.model.opset_import)
    if any(n.domain == MICROSOFT for n in runtime) and all(o.domain != MICROSOFT for o in opsets):
        opsets.append(helper.make_opsetid(MICROSOFT, 1))
    return Prepared(template, runtime, constants, boundary, evaluator, weight_inputs, names, opsets, info)


def _split(
    graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], direct: set[str]
) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """(weight part, run-time part): a standard node whose inputs are all weights,
    constants or weight-part values is in the weight part, except a Transpose of a weight in
    `direct`."""
    static = set(inits) | {v.name for v in graph.input if v.name.startswith(WEIGHT)}
    weight_nodes: list[onnx.NodeProto] = []
    runtime: list[onnx.NodeProto] = []
    for node in graph.node:
        inputs = [i for i in node.input if i]
        foldable = node.domain in STANDARD and inputs and all(i in static for i in inputs) and not _has_graph(node)
        if foldable and not (node.op_type == "Transpose" and inputs[0] in direct):
            weight_nodes.append(node)
            static.update(o for o in node.output if o)
        else:
            runtime.append(node)
    return weight_nodes, runtime


def _transposed_reads(runtime: list[onnx.NodeProto], direct: set[str]) -> list[onnx.NodeProto]:
    """MatMul(x, Transpose(w)) of a weight read as it is (a tied LM head) -> com.microsoft
    FusedMatMul(x, w, transB=1). onnxruntime folds a Transpose of an initializer into a second,
    transposed copy when a session starts (0.6 GB for a 100k x 1536 table), before its own
    Transpose+MatMul fusion could apply; FusedMatMul reads the one table as it is stored."""
    transposes = {
        n.output[0]: n
        for n in runtime
        if n.op_type == "Transpose" and n.domain in STANDARD and n.input[0] in direct and _swaps_2d(n)
    }
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in runtime:
        for i in node.input:
            if i in transposes:
                readers.setdefault(i, []).append(node)
    fused = {
        t
        for t, users in readers.items()
        if all(u.op_type == "MatMul" and u.domain in STANDARD and list(u.input).index(t) == 1 for u in users)
    }
    out = []
    for node in runtime:
        if node.op_type == "Transpose" and node.output[0] in fused:
            continue
        if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in fused:
            weight = transposes[node.input[1]].input[0]
            node = helper.make_node(
                "FusedMatMul", [node.input[0], weight], list(node.output), name=node.name, domain=MICROSOFT, transB=1
            )
        out.append(node)
    return out


def _swaps_2d(node: onnx.NodeProto) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return perm == [1, 0]


def _has_graph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _ordered(graph: onnx.GraphProto, weight_nodes: list[onnx.NodeProto]) -> list[str]:
    values = [v.name for v in graph.input]
    values += [o for n in weight_nodes for o in n.output if o]
    return values


def _weight_ancestors(nodes: list[onnx.NodeProto]) -> dict[str, set[str]]:
    """Each weight-part value -> the w:<name> inputs it is computed from."""
    out: dict[str, set[str]] = {}
    for node in nodes:
        deps: set[str] = set()
        for i in node.input:
            deps |= {i} if i.startswith(WEIGHT) else out.get(i, set())
        for o in node.output:
            out[o] = deps
    return out


def _boundary_names(
    boundary: list[str], weighted: dict[str, set[str]], layer_weight: Callable[[str], str]
) -> dict[str, str]:
    """An initializer name per boundary value: a weight read as it is keeps its name; a value
    derived from one weight alone (a Linear's transpose) takes that weight's name when nothing
    else claims it; anything else is named by its scope in the layer."""
    names: dict[str, str] = {}
    claimed = {v for v in boundary if v.startswith(WEIGHT)}
    sole: dict[str, list[str]] = {}
    for v in boundary:
        if v.startswith(WEIGHT):
            names[v] = layer_weight(v[len(WEIGHT) :])
        elif len(weighted.get(v, ())) == 1:
            sole.setdefault(next(iter(weighted[v])), []).append(v)
    for w, values in sole.items():
        if len(values) == 1 and w not in claimed:
            names[values[0]] = layer_weight(w[len(WEIGHT) :])
    for v in boundary:
        names.setdefault(v, "{scope}" + "/" + v)
    return names


@dataclass
class Fragment:
    """One layer (or the outer graph) under its final names, with its initializers' values."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto]
    opsets: list[onnx.OperatorSetIdProto]
    value_info: list[onnx.ValueInfoProto] = field(default_factory=list)


def instantiate(
    prep: Prepared,
    weights: dict[str, np.ndarray],
    io: dict[str, str],
    scope: str,
    layer: int,
    node_names: set[str],
) -> Fragment:
    """The template's run-time part under layer `layer`'s names. weights: template weight name
    (without w:) -> float32 array; io: template input/output name -> graph name; scope: the
    prefix of every other value and of unscoped nodes (/model/layers.{i})."""
    values: dict[str, np.ndarray] = {}
    if prep.evaluator is not None:
        feeds = {w: weights[w[len(WEIGHT) :]] for w in prep.weight_inputs}
        outs = [v for v in prep.boundary if not v.startswith(WEIGHT)]
        for name, value in zip(outs, prep.evaluator.run(outs, feeds)):
            values[name] = np.asarray(value)
    rename = dict(io)
    initializers: list[onnx.TensorProto] = []
    for v in prep.boundary:
        name = prep.names[v].format(i=layer, scope=scope)
        rename[v] = name
        array = weights[v[len(WEIGHT) :]] if v.startswith(WEIGHT) else values[v]
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
    for t in prep.constants:
        copy = onnx.TensorProto()
        copy.CopyFrom(t)
        copy.name = rename.setdefault(t.name, f"{scope}/{t.name}")
        initializers.append(copy)
    template_scope = f"/model/layers.{prep.template.index}/"
    nodes = []
    for node in prep.runtime:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        for k, i in enumerate(new.input):
            if i:
                new.input[k] = rename.setdefault(i, f"{scope}/{i}")
        for k, o in enumerate(new.output):
            if o:
                new.output[k] = rename.setdefault(o, f"{scope}/{o}")
        if prep.template.index >= 0:
            if node.name.startswith(template_scope):
                new.name = f"/model/layers.{layer}/" + node.name[len(template_scope) :]
            else:
                new.name = scope + node.name
        new.name = _unique(new.name, node_names)
        nodes.append(new)
    # The exporter's types and shapes of the values (int8-static's quantizer reads them).
    info = []
    for v in prep.value_info:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(v)
        copy.name = rename[v.name]
        info.append(copy)
    return Fragment(nodes, initializers, prep.opsets, info)


def _unique(name: str, taken: set[str]) -> str:
    base, k = name, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


class DataFile:
    """Initializers streamed to one external data file as they are produced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("wb")
        self.offset = 0
        self.refs: dict[str, onnx.TensorProto] = {}

    def add(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """Write the tensor's bytes; returns it with its data replaced by the file reference."""
        if tensor.name in self.refs:  # a shared weight, written by an earlier layer
            return self.refs[tensor.name]
        data = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
        if len(data) < 1024:  # small constants stay in the graph, as protos of their own
            small = onnx.TensorProto()
            small.CopyFrom(tensor)
            return small
        if len(data) >= ALIGN and self.offset % ALIGN:
            pad = ALIGN - self.offset % ALIGN
            self.file.write(b"\0" * pad)
            self.offset += pad
        self.file.write(data)
        out = onnx.TensorProto()
        out.name, out.data_type = tensor.name, tensor.data_type
        out.dims.extend(tensor.dims)
        out.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(self.offset)), ("length", str(len(data)))):
            entry = out.external_data.add()
            entry.key, entry.value = key, value
        self.offset += len(data)
        self.refs[tensor.name] = out
        return out

    def close(self) -> None:
        self.file.close()


def value_info(spec: TensorSpec) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
    return helper.make_tensor_value_info(spec.name, elem, list(spec.dims))


def assemble(fragments: Iterable[Fragment], contract: GraphContract, data: DataFile | None) -> onnx.ModelProto:
    """One graph of the fragments' nodes in topological order, with the contract's inputs and
    outputs, initializers in `data` (or inline when None)."""
    inputs, outputs = contract.inputs, contract.outputs
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    info: list[onnx.ValueInfoProto] = []
    opsets: dict[str, int] = {}
    seen: set[str] = set()
    for frag in fragments:
        nodes += frag.nodes
        info += frag.value_info
        for t in frag.initializers:
            if t.name in seen:
                continue  # a shared weight, written once
            seen.add(t.name)
            initializers.append(t if data is None else data.add(t))
        for o in frag.opsets:
            opsets[o.domain] = max(opsets.get(o.domain, 0), o.version)
    io = {s.name for s in (*inputs, *outputs)}
    nodes = live(nodes, {s.name for s in outputs})
    read = {i for n in nodes for i in node_reads(n)}
    made = {o for n in nodes for o in n.output}
    graph = helper.make_graph(
        toposort(nodes),
        "hybridrt",
        [value_info(s) for s in inputs],
        [value_info(s) for s in outputs],
        [t for t in initializers if t.name in read],
        value_info=[v for v in info if v.name not in io and v.name in made],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
