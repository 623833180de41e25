"""ONNX export in memory bounded by a layer: trace each distinct layer once (fragments.py),
then write the graph layer by layer from the memory-mapped checkpoint (compose.py).

Peak memory is a fixed overhead (the traced templates, the graph's nodes) plus the largest of
the outer graph's weights and one layer's weights with what is derived from them; export time
grows with the bytes written, not with tracing each layer. That peak, against what the machine
has, is checked before any work (memory_plan).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..graphs.contract import GraphContract
from ..graphs.files import IR_VERSION
from ..models.loading.weights import Weights, numel
from .compose import DataFile, Fragment, Prepared, assemble, instantiate
from .fragments import CTX_FIELDS, Template
from .templates import templates, weight_pattern

# A rewrite of one fragment once its weights are bound (direct quantization):
# (fragment model, layer index or -1 for the outer graph) -> the rewritten model.
LayerPass = Callable[[onnx.ModelProto, int], onnx.ModelProto]
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass
class Written:
    """What write_graph did, for the manifest's provenance."""

    templates: list[list[int]]  # layers sharing each traced template
    trace_seconds: float
    write_seconds: float
    fusion: dict[str, Any] | None
    passes: dict[str, int] = field(default_factory=dict)
    data_bytes: int = 0
    trace_cache: dict[str, Any] | None = None  # templates read from HYBRIDRT_TRACE_CACHE (trace_cache.py)


def write_graph(
    weights: Weights,
    path: Path,
    contract: GraphContract | None = None,
    *,
    fused: bool = True,
    fuse_norms: bool = True,
    layer_pass: LayerPass | None = None,
    float_copy: Path | None = None,
    say: Callable[[str], None] = lambda msg: None,
) -> Written:
    """Write the model's ONNX graph at `path` (weights in `path`.data above
    onnx_export.EXTERNAL_DATA_THRESHOLD bytes of float32 weights, inline below).
    layer_pass rewrites each fragment before it is written (direct quantization); float_copy,
    with a layer_pass, also writes the graph as it was before the pass there. `contract` is
    the export's graph contract (built from the config when not given)."""
    cfg = weights.cfg
    contract = contract or GraphContract.of(cfg)
    t0 = time.perf_counter()
    t = templates(cfg, contract, fused, fuse_norms, say)
    trace_s = time.perf_counter() - t0

    from . import onnx_export

    external = weights.nbytes() > onnx_export.EXTERNAL_DATA_THRESHOLD
    data = DataFile(path.with_name(path.name + ".data")) if external else None
    copy = Copy(float_copy, external, contract) if float_copy is not None else None
    node_names: set[str] = set()
    passes: dict[str, int] = {}
    fragments: list[Fragment] = []
    try:
        say("writing the outer graph")
        outer_io = _outer_io(t.outer, cfg.num_layers)
        frag = instantiate(t.outer_prep, _read(weights, t.outer_prep, -1), outer_io, "/model/outer", -1, node_names)
        if layer_pass is not None:
            if copy is not None:
                copy.add(frag)
            frag = _apply(layer_pass, frag, outer_io, t.outer_prep, -1, data)
        fragments.append(_stream(frag, data))
        for i in range(cfg.num_layers):
            written = f", {data.offset / 1e9:.2f} GB written" if data is not None else ""
            say(f"layer {i + 1}/{cfg.num_layers}{written}")
            prep = t.preps[t.owner[i]]
            io = _layer_io(contract, prep, i)
            frag = instantiate(prep, _read(weights, prep, i), io, f"/model/layers.{i}", i, node_names)
            frag = _layer_passes(frag, io, prep, i, layer_pass, passes, copy, data, fused and fuse_norms)
            fragments.append(_stream(frag, data))
        model = assemble(fragments, contract, None)
        if copy is not None:
            copy.save()
    finally:
        if data is not None:
            data.close()
        if copy is not None and copy.data is not None:
            copy.data.close()
    _save(model, contract, path)
    written_s = time.perf_counter() - t0 - trace_s
    offset = data.offset if data is not None else 0
    cache = t.cache.record() if t.cache is not None else None
    return Written(list(t.groups.values()), trace_s, written_s, t.fusion, passes, offset, cache)


def _outer_io(outer: Template, num_layers: int) -> dict[str, str]:
    """The outer graph's inputs and outputs, named as in the model; it reads the last layer's."""
    graph = outer.model.graph
    io = {v.name: v.name for v in [*graph.input, *graph.output] if not v.name.startswith("w:")}
    last = num_layers - 1
    return io | {"x.last": f"/model/layers.{last}/x.out", "r.last": f"/model/layers.{last}/r.out"}


def _save(model: onnx.ModelProto, contract: GraphContract, path: Path) -> None:
    """The assembled graph saved at `path`, with its producer and the contract's state metadata."""
    model.ir_version = IR_VERSION
    model.producer_name = "hybridrt"
    for key, value in contract.state_metadata().items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    onnx.save_model(model, str(path))


def _read(weights: Weights, prep: Prepared, i: int) -> dict[str, np.ndarray]:
    pattern = weight_pattern(prep.template.index)
    out = {}
    for name in prep.template.weights:
        actual = pattern(name).format(i=i)
        out[name] = weights[actual].numpy()
    return out


def _layer_io(contract: GraphContract, prep: Prepared, i: int) -> dict[str, str]:
    pasts = [s.name for s in contract.layer_pasts(i)]
    presents = [s.name for s in contract.layer_presents(i)]
    io = {
        "x": "x.first" if i == 0 else f"/model/layers.{i - 1}/x.out",
        "r": f"/model/layers.{i - 1}/r.out",
        "ctx.embeds": "x.first",
        "x.out": f"/model/layers.{i}/x.out",
        "r.out": f"/model/layers.{i}/r.out",
    }
    io |= {f"ctx.{k}": f"ctx.{k}" for k in CTX_FIELDS}
    io |= {f"state.{k}": n for k, n in enumerate(pasts)}
    io |= {f"present.{k}": n for k, n in enumerate(presents)}
    return io


class Copy:
    """The graph as it was before the layer pass, written beside (for a quality report)."""

    def __init__(self, path: Path, external: bool, contract: GraphContract) -> None:
        self.path, self.contract = path, contract
        self.data = DataFile(path.with_name(path.name + ".data")) if external else None
        self.fragments: list[Fragment] = []

    def add(self, frag: Fragment) -> None:
        """`frag`, a copy of its own (_detached), before the pass rewrites it."""
        if self.data is None:  # new lists: _fragment_model empties the one it is given
            frag = Fragment(list(frag.nodes), list(frag.initializers), list(frag.opsets), list(frag.value_info))
        self.fragments.append(_stream(frag, self.data))

    def save(self) -> None:
        model = assemble(self.fragments, self.contract, None)
        model.ir_version = IR_VERSION
        model.producer_name = "hybridrt"
        onnx.save_model(model, str(self.path))
        self.fragments = []


def _layer_passes(
    frag: Fragment,
    io: dict[str, str],
    prep: Prepared,
    i: int,
    layer_pass: LayerPass | None,
    counts: dict[str, int],
    copy: Copy | None = None,
    data: DataFile | None = None,
    pack: bool = True,
) -> Fragment:
    """The rewrites that need the layer's weight values, on the layer alone."""
    from ..models.ops import interleave_experts
    from .projections import expand_selective_scans, fold_scales, pack_qkv

    model = _fragment_model(frag, io, prep)
    if pack:  # with the norm fusion, as one switch (--no-fuse-norms keeps the exporter's graph)
        counts["packed_qkv"] = counts.get("packed_qkv", 0) + pack_qkv(model)
        own = f"model.layers.{i}."  # a weight of another name is shared with other layers
        counts["folded_scales"] = counts.get("folded_scales", 0) + fold_scales(model, lambda n: n.startswith(own))
    counts["selective_scans"] = counts.get("selective_scans", 0) + expand_selective_scans(model)
    counts["moe_interleaved"] = counts.get("moe_interleaved", 0) + interleave_experts(model)
    if layer_pass is not None:
        if copy is not None:
            copy.add(_detached(model))
        model = layer_pass(model, i)
    return _detached(model, data)


def _apply(
    layer_pass: LayerPass, frag: Fragment, io: dict[str, str], prep: Prepared, i: int, data: DataFile | None
) -> Fragment:
    return _detached(layer_pass(_fragment_model(frag, io, prep), i), data)


def _detached(model: onnx.ModelProto, data: DataFile | None = None) -> Fragment:
    """The model's nodes and initializers as protos of their own (initializers written to
    `data` when given). A message taken from a model's repeated field shares the model's
    memory (protobuf's arena): kept, one node would keep the whole layer's weights alive
    after they are written."""
    nodes = [onnx.NodeProto() for _ in model.graph.node]
    for new, node in zip(nodes, model.graph.node):
        new.CopyFrom(node)
    inits = []
    for t in model.graph.initializer:
        if data is not None:
            inits.append(data.add(t))
        else:
            inits.append(onnx.TensorProto())
            inits[-1].CopyFrom(t)
    opsets = [onnx.OperatorSetIdProto() for _ in model.opset_import]
    for new_o, o in zip(opsets, model.opset_import):
        new_o.CopyFrom(o)
    made = {o for n in model.graph.node for o in n.output}
    info = [onnx.ValueInfoProto() for v in model.graph.value_info if v.name in made]
    for new_v, v in zip(info, [v for v in model.graph.value_info if v.name in made]):
        new_v.CopyFrom(v)
    return Fragment(nodes, inits, opsets, info)


def _fragment_model(frag: Fragment, io: dict[str, str], prep: Prepared) -> onnx.ModelProto:
    """The fragment as a model of its own (its initializers move into it): the values it
    reads from other fragments are its inputs and those it passes on its outputs (typed as in
    the template), so that rewrites which drop what nothing reads keep them."""
    template = prep.template.model.graph
    inits = {t.name for t in frag.initializers}

    def typed(v: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
        out = onnx.ValueInfoProto()
        out.CopyFrom(v)
        out.name = io[v.name]
        return out

    inputs = [typed(v) for v in template.input if v.name in io and io[v.name] not in inits]
    read = {i for n in frag.nodes for i in n.input}
    inputs = list({v.name: v for v in inputs if v.name in read}.values())
    outputs = [typed(v) for v in template.output]
    graph = onnx.helper.make_graph(
        frag.nodes, "fragment", inputs, outputs, frag.initializers, value_info=frag.value_info
    )
    frag.initializers.clear()  # the graph holds copies now: one copy of the layer's weights at a time
    return onnx.helper.make_model(graph, opset_imports=frag.opsets)


def _stream(frag: Fragment, data: DataFile | None) -> Fragment:
    if data is None:
        return frag
    return Fragment(frag.nodes, [data.add(t) for t in frag.initializers], frag.opsets, frag.value_info)


def memory_plan(weights: Weights, validate: bool, quantized: bool) -> dict[str, int]:
    """Bytes the streamed export will hold at its peak, by stage: writing holds the largest
    fragment's float32 weights about three times (read, derived, serialized); the parity check
    holds the float graph in an onnxruntime session beside one reference layer."""
    layer: dict[int, int] = {}
    outer = 0
    for name, shape in weights.shapes.items():
        n = 4 * numel(shape)
        m = _LAYER.match(name)
        if m:
            layer[int(m.group(1))] = layer.get(int(m.group(1)), 0) + n
        else:
            outer += n
    largest = max([outer, *layer.values()])
    plan = {"float32_bytes": weights.nbytes(), "largest_fragment_bytes": largest, "overhead_bytes": OVERHEAD}
    plan["write_bytes"] = OVERHEAD + 3 * largest
    plan["check_bytes"] = OVERHEAD + weights.nbytes() + 2 * largest if validate and not quantized else 0
    plan["peak_bytes"] = max(plan["write_bytes"], plan["check_bytes"])
    return plan


OVERHEAD = 1_500_000_000  # torch, onnxruntime, the traced templates and the graph's nodes


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), None elsewhere: no check then (the runtime's
    input_checks.available_memory guesses a figure there, which would refuse large exports)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
