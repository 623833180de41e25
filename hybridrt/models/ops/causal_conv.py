"""`causal_conv`: a depthwise causal conv that continues from a state of the last k-1 inputs,
then SiLU where the mixer applies one.

Glossary: b batch, C channels, l length, k kernel.

In ONNX it is one com.microsoft CausalConvWithState node instead of Concat, Conv and Slice,
with SiLU as Sigmoid and Mul after it: onnxruntime fuses those into its vectorized QuickGelu,
where the node's own SiLU is scalar (granite-h-350m's conv, 1,792 channels, 225 tokens: 2.4 ms
with the node's SiLU, 1.2-1.5 ms without it; one token 0.0245 against 0.0228 ms with the
QuickGelu, docs/notes/onnxruntime-fused-ops.md, "The conv's SiLU").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
import torch
import torch.nn.functional as F

from .registry import FusedOp, register


def _causal_conv_reference(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    k = weight.shape[-1]
    xc = torch.cat([conv_state, x], dim=-1)  # [b, C, k-1+l]
    new_state = xc[:, :, xc.shape[-1] - (k - 1) :]
    y = F.conv1d(xc, weight, bias, groups=x.shape[1])
    return (F.silu(y) if silu else y), new_state


@torch.library.custom_op("hybridrt::causal_conv", mutates_args=())
def _causal_conv_op(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, silu: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    y, state = _causal_conv_reference(x, conv_state, weight, bias, silu)
    return y.contiguous(), state.contiguous()


@_causal_conv_op.register_fake
def _(x, conv_state, weight, bias, silu):  # type: ignore[no-untyped-def]
    return torch.empty_like(x), torch.empty_like(conv_state)


def causal_conv(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool = False,
    *,
    fused: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv continuing from a state, then SiLU if `silu`.

    x [b, C, l], conv_state [b, C, k-1] (the last k-1 inputs), weight [C, 1, k] ->
    (y [b, C, l], new state [b, C, k-1]).
    """
    if fused:
        if bias is None:
            bias = weight.new_zeros(weight.shape[0])
        return _causal_conv_op(x, conv_state, weight, bias, silu)
    return _causal_conv_reference(x, conv_state, weight, bias, silu)


def _translation() -> Callable[..., Any]:
    from onnx.defs import OpSchema
    from onnxscript import opset20, values

    op: Any = opset20

    T = "T"
    schema = OpSchema(
        "CausalConvWithState",
        "com.microsoft",
        1,
        inputs=[
            OpSchema.FormalParameter("input", T),
            OpSchema.FormalParameter("weight", T),
            OpSchema.FormalParameter("bias", T),
            OpSchema.FormalParameter("past_state", T),
        ],
        outputs=[OpSchema.FormalParameter("output", T), OpSchema.FormalParameter("present_state", T)],
        type_constraints=[(T, ["tensor(float)"], "")],
        attributes=[OpSchema.Attribute("activation", OpSchema.AttrType.STRING, "")],
    )
    conv_with_state = values.Op(values.Opset("com.microsoft", 1), "CausalConvWithState", schema)

    def causal_conv_onnx(x, conv_state, weight, bias, silu):  # type: ignore[no-untyped-def]
        y, state = conv_with_state(x, weight, bias, conv_state, activation="none")
        return (op.Mul(y, op.Sigmoid(y)) if silu else y), state

    return causal_conv_onnx


def _infer_shapes(helper: Any, node: onnx.NodeProto) -> None:
    # output: the input's shape; present_state: past_state's shape
    helper._propagate_shape_and_type(node, 0, 0)
    helper._propagate_shape_and_type(node, 3, 1)


register(FusedOp("causal_conv", _translation, shapes={"CausalConvWithState": _infer_shapes}))
