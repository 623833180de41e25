"""The graph copy in a Triton model repository (triton.py): the graph with Triton's sequence
controls as inputs and `logit_positions` computed inside it, its weights hard-linked."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import DeployError

# name, Triton control kind, dtype: START and READY say 0/1 per batch slot, CORRID the sequence id.
CONTROLS = (
    ("START", "CONTROL_SEQUENCE_START", "int32"),
    ("READY", "CONTROL_SEQUENCE_READY", "int32"),
    ("CORRID", "CONTROL_SEQUENCE_CORRID", "uint64"),
)
BATCH = "batch"
LOGIT_POSITIONS = "logit_positions"  # computed inside the repository's graph copy


def write_graph(src: Path, dst: Path, batched: bool) -> None:
    """The graph with the control inputs added; its weights file hard-linked (or copied)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(src), load_external_data=False)
    _compute_logit_positions(model)
    names = {i.name for i in model.graph.input}
    kinds = {"int32": TensorProto.INT32, "uint64": TensorProto.UINT64}
    for name, _, dtype in CONTROLS:
        if name in names:
            raise DeployError(f"{src} already has an input named {name}, which Triton's sequence controls need")
        shape: list[str | int] = [BATCH, 1] if batched else [1]
        model.graph.input.append(helper.make_tensor_value_info(name, kinds[dtype], shape))
    onnx.save_model(model, str(dst))  # keeps the loaded ir_version and the external data references
    for location in sorted(_external_files(model)):
        _link_or_copy(src.parent / location, dst.parent / location)


def _compute_logit_positions(model: Any) -> None:
    """Replace the `logit_positions` input by [seq - 1] computed from input_ids, in place."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inputs = [i for i in graph.input if i.name == LOGIT_POSITIONS]
    if not inputs:
        return
    graph.input.remove(inputs[0])
    import numpy as np

    consts = {"triton/one": np.array(1, np.int64), "triton/shape1": np.array([1], np.int64)}
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["triton/seq"], name="/triton/Shape", start=1, end=2),
        helper.make_node("Sub", ["triton/seq", "triton/one"], ["triton/last"], name="/triton/Sub"),
        helper.make_node("Reshape", ["triton/last", "triton/shape1"], [LOGIT_POSITIONS], name="/triton/Reshape"),
    ]
    for i, node in enumerate(nodes):
        graph.node.insert(i, node)


def _external_files(model: Any) -> set[str]:
    """The files the graph's external tensors live in (initializers and Constant nodes)."""
    from onnx import TensorProto

    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.HasField("t")]
    return {
        e.value
        for t in tensors
        if t.data_location == TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }


def _link_or_copy(src: Path, dst: Path) -> None:
    if not src.is_file():
        raise DeployError(f"{src}, the graph's external data, is missing; re-export the model")
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(src, dst)
