"""`moe`: a top-k mixture of gated-MLP experts behind a softmax router, SiLU-gated
(Jamba, Granite-4.0-H, Qwen3-Next/3.5 MoE).

Glossary: n tokens, d hidden, E experts, f expert width, k experts per token.

The reference runs every expert on every token and weights the unchosen ones by 0 (exact and
shape-static). In ONNX it is one com.microsoft MoE node, which runs only the k chosen experts
of each token: the layer costs what its active parameters cost. Its router input is the
router's logits (the node applies the softmax and, with normalize_routing_weights, the top-k
renormalization). The quantizers turn it into QMoE with block-wise 4- or 8-bit experts
(quantization.moe).

Layout: the checkpoint's gate_up [E, 2f, d] holds [gate | up] (swiglu_fusion=2, as traced);
onnxruntime's CPU kernel reads them interleaved, row 2j the gate and 2j+1 the up of unit j
(swiglu_fusion=1), so `interleave_experts` rewrites each layer's weights once they are bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F

from .registry import FusedOp, fusable, register

MS_DOMAIN = "com.microsoft"


def moe_reference(
    x: torch.Tensor, logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, k: int, renormalize: bool
) -> torch.Tensor:
    """The experts' weighted sum for each token: x [n, d], router logits [n, E], gate_up
    [E, 2f, d], down [E, d, f] -> [n, d]."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_w, top_i = torch.topk(probs, k, dim=-1)
    if renormalize:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(-1, top_i, top_w).to(x.dtype)  # [n, E]
    gate, up = torch.einsum("nd,efd->nef", x, gate_up).chunk(2, dim=-1)
    y = torch.einsum("nef,edf->ned", F.silu(gate) * up, down)
    return (y * weights.unsqueeze(-1)).sum(dim=1)


moe = fusable("moe", moe_reference, like=0)


def _translation() -> Callable[..., Any]:
    from onnx.defs import OpSchema
    from onnxscript import values

    T = "T"
    optional = OpSchema.FormalParameterOption.Optional
    schema = OpSchema(
        "MoE",
        MS_DOMAIN,
        1,
        inputs=[
            OpSchema.FormalParameter("input", T),
            OpSchema.FormalParameter("router_probs", T),
            OpSchema.FormalParameter("fc1_experts_weights", T),
            OpSchema.FormalParameter("fc1_experts_bias", T, param_option=optional),
            OpSchema.FormalParameter("fc2_experts_weights", T),
        ],
        outputs=[OpSchema.FormalParameter("output", T)],
        type_constraints=[(T, ["tensor(float)"], "")],
        attributes=[
            OpSchema.Attribute("k", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("normalize_routing_weights", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("activation_type", OpSchema.AttrType.STRING, ""),
            OpSchema.Attribute("swiglu_fusion", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("activation_alpha", OpSchema.AttrType.FLOAT, ""),
            OpSchema.Attribute("activation_beta", OpSchema.AttrType.FLOAT, ""),
        ],
    )
    moe_node = values.Op(values.Opset(MS_DOMAIN, 1), "MoE", schema)

    def moe_onnx(x, logits, gate_up, down, k, renormalize):  # type: ignore[no-untyped-def]
        # swiglu with alpha 1 and beta 0 and no limit is silu(gate) * up.
        return moe_node(
            x,
            logits,
            gate_up,
            None,
            down,
            k=k,
            normalize_routing_weights=1 if renormalize else 0,
            activation_type="swiglu",
            swiglu_fusion=2,
            activation_alpha=1.0,
            activation_beta=0.0,
        )

    return moe_onnx


def _infer_shapes(helper: Any, node: onnx.NodeProto) -> None:
    helper._propagate_shape_and_type(node, 0, 0)  # output: the input's shape


def _attr(node: onnx.NodeProto, name: str) -> Any:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def interleave_experts(model: onnx.ModelProto) -> int:
    """Each MoE node whose gate_up weight is an initializer in [gate | up] order
    (swiglu_fusion=2) gets it interleaved (swiglu_fusion=1), the layout onnxruntime's CPU
    kernel reads; in place. Returns how many."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    done = 0
    for node in model.graph.node:
        if node.op_type not in ("MoE", "QMoE") or node.domain != MS_DOMAIN or _attr(node, "swiglu_fusion") != 2:
            continue
        if node.op_type != "MoE" or node.input[2] not in inits:
            continue
        tensor = inits[node.input[2]]
        w = numpy_helper.to_array(tensor)  # [E, 2f, d]
        e, two_f, d = w.shape
        w = np.ascontiguousarray(w.reshape(e, 2, two_f // 2, d).transpose(0, 2, 1, 3).reshape(e, two_f, d))
        tensor.CopyFrom(numpy_helper.from_array(w, tensor.name))
        for a in node.attribute:
            if a.name == "swiglu_fusion":
                a.i = 1
        done += 1
    return done


register(FusedOp("moe", _translation, shapes={"MoE": _infer_shapes, "QMoE": _infer_shapes}))
