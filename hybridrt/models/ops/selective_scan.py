"""`selective_scan`: the Mamba1 recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t,
y_t = C_t h_t.

Glossary: b batch, l length, H channels (d_inner), n d_state.

In ONNX it becomes an onnxruntime Scan over the tokens whose body is the one-token step on the
state as the contract stores it, [b, n, H]: torch.onnx writes a SelectiveScan placeholder
(domain SCAN_DOMAIN), which `expand_scans` replaces before the graph is saved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
import torch

from ...graphs.edit import constant_value, prune
from ..recurrences.scan import linear_scan
from .registry import SCAN_DOMAIN, FusedOp, fusable, register


def _scan_reference(
    xdt: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    h0: torch.Tensor,
    chunk: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Mamba1 recurrence h_t = exp(dt_t A) h_{t-1} + (dt x)_t B_t, y_t = h_t C_t.

    xdt = dt x and dt [b, l, H], A [n, H], B, C [b, l, n], h0 [b, n, H] (the graph contract's
    state layout: channels innermost, like A) -> y [b, l, H], h [b, n, H]."""
    u = B.unsqueeze(-1) * xdt.unsqueeze(2)  # [b, l, n, H]
    decay = torch.exp(dt.unsqueeze(2) * A)
    h, last = linear_scan(decay, u, h0, chunk, max_len)
    return (h * C.unsqueeze(-1)).sum(2), last


selective_scan = fusable("selective_scan", _scan_reference, like=(0, 5))


def _translation() -> Callable[..., Any]:
    from onnx.defs import OpSchema
    from onnxscript import values

    T = "T"
    schema = OpSchema(
        "SelectiveScan",
        SCAN_DOMAIN,
        1,
        inputs=[OpSchema.FormalParameter(n, T) for n in ("xdt", "dt", "A", "B", "C", "past_state")],
        outputs=[OpSchema.FormalParameter("output", T), OpSchema.FormalParameter("present_state", T)],
        type_constraints=[(T, ["tensor(float)"], "")],
        attributes=[OpSchema.Attribute("heads", OpSchema.AttrType.INT, "")],
    )
    scan_node = values.Op(values.Opset(SCAN_DOMAIN, 1), "SelectiveScan", schema)

    def selective_scan_onnx(xdt, dt, A, B, C, h0, chunk, max_len):  # type: ignore[no-untyped-def]
        # A placeholder that expand_scans replaces by a Scan.
        return scan_node(xdt, dt, A, B, C, h0, heads=xdt.shape[2])

    return selective_scan_onnx


def _infer_shapes(helper: Any, node: onnx.NodeProto) -> None:
    # output: xdt's shape; present_state: past_state's shape
    helper._propagate_shape_and_type(node, 0, 0)
    helper._propagate_shape_and_type(node, 5, 1)


def expand_scans(model: onnx.ModelProto) -> int:
    """Replace each SelectiveScan placeholder by an onnxruntime Scan, in place.

    The Mamba1 scan has d_inner channels, each with its own d_state-wide state and decay,
    h_t = exp(dt_t A) * h_{t-1} + B_t (dt x)_t, y_t = C_t h_t. onnxruntime has no operator for
    it: LinearAttention takes it as d_inner heads of one value each, and its per-head loop is
    slow. Measured per layer at jamba-125m's sizes, 2 threads (docs/notes/onnxruntime-fused-ops,
    mamba1_scan.py): 12.7 ms for 128 tokens and 363 ms for 1,900, against 2.2 and 34 ms for
    this Scan; one token 88 us against 27 us (21 us for the step as plain nodes, no Scan). So
    the scan is a Scan over the sequence whose body is the step on the state as the contract
    stores it, [b, n, H] with channels innermost (every product broadcasts along the long axis):

        h = exp(dt_t * A) * h + B_t^T (dt x)_t,   y_t = C_t h

    six nodes per token, with A a constant of the body. The Scan reads nothing from the outer
    graph but its inputs, so tools that order nodes or drop constants by top-level inputs
    alone (onnxruntime's quantizers do) keep it whole. Returns the number of scans."""
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    scans = [n for n in graph.node if n.domain == SCAN_DOMAIN and n.op_type == "SelectiveScan"]
    if not scans:
        return 0
    consts = {
        "/scan/axis2": np.array([2], np.int64),
        "/scan/axis3": np.array([3], np.int64),
        "/scan/packed": np.array([0, 0, -1], np.int64),
    }
    for node in scans:
        scope = node.name.rsplit("/", 1)[0] if "/" in node.name else f"/scan_{scans.index(node)}"
        decay_rates = constant_value(model, node.input[2]).astype(np.float32)  # A [n, H]
        at = list(graph.node).index(node)
        graph.node.remove(node)
        for n in reversed(_scan_nodes(node, scope, decay_rates)):
            graph.node.insert(at, n)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    prune(graph, initializers=True)
    kept = [o for o in model.opset_import if o.domain != SCAN_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return len(scans)


def _scan_nodes(node: onnx.NodeProto, scope: str, decay_rates: Any) -> list[onnx.NodeProto]:
    """The nodes that replace one placeholder: per-token views of its inputs, the Scan whose
    body holds A [n, H] as a constant, and the output back in [b, l, H]."""
    from onnx import helper, numpy_helper

    xdt, dt, _, B, C, h0 = node.input
    y, h1 = node.output
    f = onnx.TensorProto.FLOAT
    s = f"{scope}/scan"
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["dt", "A"], ["log_decay"], name=f"{s}/Mul"),
            helper.make_node("Exp", ["log_decay"], ["decay"], name=f"{s}/Exp"),
            helper.make_node("Mul", ["decay", "state"], ["kept"], name=f"{s}/Mul_1"),
            helper.make_node("Mul", ["key", "xdt"], ["written"], name=f"{s}/Mul_2"),
            helper.make_node("Add", ["kept", "written"], ["new_state"], name=f"{s}/Add"),
            helper.make_node("MatMul", ["query", "new_state"], ["y"], name=f"{s}/MatMul"),
        ],
        f"{s.strip('/').replace('/', '_')}_step",
        [
            helper.make_tensor_value_info("state", f, ["batch", "n", "H"]),
            helper.make_tensor_value_info("dt", f, ["batch", 1, "H"]),
            helper.make_tensor_value_info("xdt", f, ["batch", 1, "H"]),
            helper.make_tensor_value_info("key", f, ["batch", "n", 1]),
            helper.make_tensor_value_info("query", f, ["batch", 1, "n"]),
        ],
        [
            helper.make_tensor_value_info("new_state", f, ["batch", "n", "H"]),
            helper.make_tensor_value_info("y", f, ["batch", 1, "H"]),
        ],
        [numpy_helper.from_array(decay_rates, "A")],
    )
    per_token = [f"{s}/dt", f"{s}/xdt", f"{s}/key", f"{s}/query"]
    return [
        helper.make_node("Unsqueeze", [dt, "/scan/axis2"], [per_token[0]], name=f"{s}/Unsqueeze"),
        helper.make_node("Unsqueeze", [xdt, "/scan/axis2"], [per_token[1]], name=f"{s}/Unsqueeze_1"),
        helper.make_node("Unsqueeze", [B, "/scan/axis3"], [per_token[2]], name=f"{s}/Unsqueeze_2"),
        helper.make_node("Unsqueeze", [C, "/scan/axis2"], [per_token[3]], name=f"{s}/Unsqueeze_3"),
        helper.make_node(
            "Scan",
            [h0, *per_token],
            [h1, f"{s}/y"],
            name=f"{scope}/SelectiveScan",
            body=body,
            num_scan_inputs=4,
            scan_input_axes=[1, 1, 1, 1],
            scan_output_axes=[1],
        ),
        helper.make_node("Reshape", [f"{s}/y", "/scan/packed"], [y], name=f"{s}/Reshape"),
    ]


register(FusedOp("selective_scan", _translation, shapes={"SelectiveScan": _infer_shapes}, expand=expand_scans))
