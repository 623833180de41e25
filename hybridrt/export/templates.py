"""The templates an export instantiates (export.streamed): every distinct layer's and the outer
graph's, traced (fragments.py) or read from the trace cache (trace_cache.py, only where
$HYBRIDRT_TRACE_CACHE names one), with their norms fused (export.fuse), their value types
annotated, and each prepared for instantiation (compose.py).

Layer 0's template is made from a later layer's instead of traced where a later layer has its
signature (first_from, first_layer): layer 0 differs from the rest only in having no previous
block's output to add, so a graph edit gives its template.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx

from ..config import HybridConfig
from ..graphs.contract import GraphContract
from .compose import Prepared, prepare
from .fragments import TRACE_CACHE_ENV, Template, layer_blocks, outer_model, signature, trace_layer, trace_outer

if TYPE_CHECKING:
    from .trace_cache import TraceCache


@dataclass
class Templates:
    """What the writing instantiates: the layers grouped by template (first layer of each group
    first), the outer graph's template, each template prepared for its layers, and the records
    of the norm fusion and the trace cache (None without one)."""

    groups: dict[tuple[object, ...], list[int]]
    outer: Template
    outer_prep: Prepared
    preps: dict[int, Prepared]
    owner: dict[int, int]  # layer -> the first layer of its group
    fusion: Any
    cache: TraceCache | None


def templates(
    cfg: HybridConfig, contract: GraphContract, fused: bool, fuse_norms: bool, say: Callable[[str], None]
) -> Templates:
    """Every distinct layer's template and the outer graph's, traced or read from the trace
    cache, fused and prepared for instantiation."""
    outer = outer_model(cfg)
    layers = list(range(cfg.num_layers))
    blocks, shared = layer_blocks(cfg, layers)
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in layers:
        groups.setdefault(signature(cfg, outer, i, blocks[i], shared, contract), []).append(i)
    source = first_from(groups)  # layer 0's template is made from this layer's (first_layer)
    traced = len(groups) - (source is not None)
    say(f"tracing {traced} distinct layers of {cfg.num_layers} and the outer graph")
    cache = _trace_cache()
    templates: dict[int, Template] = {}
    for members in groups.values():
        j = members[0]
        if j != 0 or source is None:
            trace = functools.partial(trace_layer, cfg, outer, j, blocks[j], shared, fused, contract)
            templates[j] = _traced(cache, cfg, j, fused, contract, trace)
    if source is not None:
        first = first_layer(templates[source])
        if first is None:
            trace = functools.partial(trace_layer, cfg, outer, 0, blocks[0], shared, fused, contract)
            first = _traced(cache, cfg, 0, fused, contract, trace)
        templates[0] = first
    outer_t = _traced(cache, cfg, -1, fused, contract, functools.partial(trace_outer, cfg, outer, fused, contract))
    del blocks
    fusion = _fuse({-1: outer_t, **templates}, groups) if fused and fuse_norms else None
    for t in [outer_t, *templates.values()]:
        _annotate(t.model)
    preps = {j: prepare(t, weight_pattern(t.index), fused) for j, t in templates.items()}
    owner = {i: members[0] for members in groups.values() for i in members}
    return Templates(groups, outer_t, prepare(outer_t, weight_pattern(-1), fused), preps, owner, fusion, cache)


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


def _trace_cache() -> TraceCache | None:
    """The trace cache in the directory $HYBRIDRT_TRACE_CACHE names; None (and trace_cache.py
    not imported) without one."""
    if not os.environ.get(TRACE_CACHE_ENV):
        return None
    from .trace_cache import TraceCache

    return TraceCache.from_env()


def _traced(
    cache: TraceCache | None,
    cfg: HybridConfig,
    index: int,
    fused: bool,
    contract: GraphContract,
    trace: Callable[[], Template],
) -> Template:
    """Template `index` (-1: the outer graph): read from the trace cache, or traced (and stored
    there)."""
    if cache is None:
        return trace()
    from .trace_cache import template_key

    return cache.get(template_key(cfg, index, fused, contract), trace)


def weight_pattern(j: int) -> Callable[[str], str]:
    """Template j's weight names as patterns over the layer index (the outer graph's as they are)."""
    prefix = f"model.layers.{j}."

    def pattern(name: str) -> str:
        return "model.layers.{i}." + name[len(prefix) :] if j >= 0 and name.startswith(prefix) else name

    return pattern


def _annotate(model: onnx.ModelProto) -> None:
    """The type of every value, from onnxruntime's symbolic shape inference (with
    export.fuse's rules for the com.microsoft operators it does not know), as the value_info
    quantizers read (int8-static inserts its QDQ pairs only where it knows a tensor's type)."""
    from .fuse import _shape_helper

    helper = _shape_helper(model)
    if helper is None:
        return
    produced = {o for n in model.graph.node for o in n.output if o} - {v.name for v in model.graph.output}
    del model.graph.value_info[:]
    for name, v in sorted(helper.known_vi_.items()):
        elem = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else 0
        if name in produced and elem:
            # Types only: onnxruntime plans buffers by value_info shapes, and symbolic inference
            # may fix a size (a chunk count) that is symbolic at run time.
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, elem, None))


def _fuse(templates: dict[int, Template], groups: dict[tuple[object, ...], list[int]]) -> dict[str, Any]:
    """RMSNorm fusion on each template (export.fuse.fuse_norms): the norms' weights need not
    be constants for it, so it runs once per distinct layer. Counts are per model. templates:
    first member of a group (-1 the outer graph) -> its template."""
    from .fuse import FUSED_NORM_OPS, fuse_norms

    size = {members[0]: len(members) for members in groups.values()}
    total: dict[str, Any] = {}
    for j, t in templates.items():
        report = fuse_norms(t.model)
        n = size.get(j, 1)
        for op in FUSED_NORM_OPS:
            total[op] = total.get(op, 0) + n * report[op]
        total["passes"] = report["passes"]
        total["skip_fusion"] = total.get("skip_fusion", True) and report["skip_fusion"]
        total.setdefault("unfused", []).extend(report["unfused"])
    return total
