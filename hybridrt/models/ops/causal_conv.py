"""`causal_conv`: a depthwise causal conv over channels-last tokens that continues from a state
of the last k-1 inputs, with SiLU fused where the mixer applies one.

Glossary: b batch, C channels, l length, k kernel.

The tokens stay in the mixers' [b, l, C] layout; the state is the graph contract's [b, C, k-1].
In ONNX torch.onnx writes a CausalConv placeholder (domain SCAN_DOMAIN) that `expand_convs`
replaces, before the graph is saved, by an If on the call's length:

- several tokens (a prompt): an ONNX Conv over the state and the tokens as [b, C, 1, k-1+l],
  whose weight the branch holds itself. onnxruntime's CPU provider then runs it in its blocked
  NCHWc layout (x86), reading the channels-last tokens directly. granite-h-350m's conv (1,792
  channels, 225 tokens, 2 threads): 0.53 ms against 2.46 ms for the transposes and
  CausalConvWithState before; with the If 0.77 ms. It does not do so for a weight the branch
  reads from the outer graph.
- one token (a decode step): onnxruntime's CausalConvWithState, 0.027 ms with the If. A grouped
  Conv where NCHWc is not available (Arm, or onnxruntime's layout optimizations off) takes
  0.156 ms for one token.

SiLU is Sigmoid and Mul in both branches (onnxruntime fuses them; CausalConvWithState's own
SiLU took 1.2 of its 2.4 ms at 225 tokens). `graphs.step_graph.inline_ifs` keeps the one-token
branch alone in the graph that captured decode steps run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
import torch
import torch.nn.functional as F

from ...graphs.edit import constant_value, prune
from ...graphs.manifest import MS_DOMAIN
from ...graphs.step_graph import SEVERAL_TOKENS
from .registry import SCAN_DOMAIN, FusedOp, register


def _causal_conv_reference(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    k = weight.shape[-1]
    xc = torch.cat([conv_state, x.transpose(1, 2)], dim=-1)  # [b, C, k-1+l]
    new_state = xc[:, :, xc.shape[-1] - (k - 1) :]
    y = F.conv1d(xc, weight, bias, groups=x.shape[-1]).transpose(1, 2)
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

    x [b, l, C], conv_state [b, C, k-1] (the last k-1 inputs), weight [C, 1, k] ->
    (y [b, l, C], new state [b, C, k-1]).
    """
    if fused:
        if bias is None:
            bias = weight.new_zeros(weight.shape[0])
        return _causal_conv_op(x, conv_state, weight, bias, silu)
    return _causal_conv_reference(x, conv_state, weight, bias, silu)


def _translation() -> Callable[..., Any]:
    from onnx.defs import OpSchema
    from onnxscript import values

    T = "T"
    schema = OpSchema(
        "CausalConv",
        SCAN_DOMAIN,
        1,
        inputs=[OpSchema.FormalParameter(n, T) for n in ("input", "past_state", "weight", "bias")],
        outputs=[OpSchema.FormalParameter("output", T), OpSchema.FormalParameter("present_state", T)],
        type_constraints=[(T, ["tensor(float)"], "")],
        attributes=[OpSchema.Attribute("silu", OpSchema.AttrType.INT, "")],
    )
    placeholder = values.Op(values.Opset(SCAN_DOMAIN, 1), "CausalConv", schema)

    def causal_conv_onnx(x, conv_state, weight, bias, silu):  # type: ignore[no-untyped-def]
        # A placeholder that expand_convs replaces by an If on the call's length.
        return placeholder(x, conv_state, weight, bias, silu=int(bool(silu)))

    return causal_conv_onnx


def _infer_shapes(helper: Any, node: onnx.NodeProto) -> None:
    # output: the input's shape; present_state: past_state's shape
    helper._propagate_shape_and_type(node, 0, 0)
    helper._propagate_shape_and_type(node, 1, 1)


def expand_convs(model: onnx.ModelProto) -> int:
    """Replace each CausalConv placeholder by an If on the call's length (the module's
    docstring), in place; each branch holds its own copy of the weight and bias, and the
    graph's own copies go. Returns the number of convs."""
    import numpy as np

    graph = model.graph
    convs = [n for n in graph.node if n.domain == SCAN_DOMAIN and n.op_type == "CausalConv"]
    for index, node in enumerate(convs):
        scope = node.name.rsplit("/", 1)[0] if "/" in node.name else f"/conv_{index}"
        weight = constant_value(model, node.input[2]).astype(np.float32)  # [C, 1, k]
        bias = constant_value(model, node.input[3]).astype(np.float32)
        silu = bool(next((a.i for a in node.attribute if a.name == "silu"), 0))
        at = list(graph.node).index(node)
        graph.node.remove(node)
        nodes, length_one = _conv_nodes(node, f"{scope}/CausalConv", weight, bias, silu)
        for n in reversed(nodes):
            graph.node.insert(at, n)
        graph.initializer.append(length_one)
    if convs:
        prune(graph, initializers=True)
        if not any(o.domain == MS_DOMAIN for o in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    return len(convs)


def _conv_nodes(
    node: onnx.NodeProto, s: str, weight: Any, bias: Any, silu: bool
) -> tuple[list[onnx.NodeProto], onnx.TensorProto]:
    """The nodes that replace one placeholder (the call's length, then the If) and the constant
    they compare the length with."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    x, state = node.input[0], node.input[1]
    one = numpy_helper.from_array(np.array([1], np.int64), f"{s}/one")
    f = TensorProto.FLOAT

    def outputs(prefix: str) -> list[onnx.ValueInfoProto]:
        return [
            helper.make_tensor_value_info(f"{prefix}/y", f, None),
            helper.make_tensor_value_info(f"{prefix}/state", f, None),
        ]

    prompt = helper.make_graph(
        _prompt_branch(x, state, f"{s}/prompt", weight, silu), "prompt", [], outputs(f"{s}/prompt")
    )
    prompt.initializer.extend(_prompt_constants(f"{s}/prompt", weight, bias))
    step = helper.make_graph(_step_branch(x, state, f"{s}/step", silu), "step", [], outputs(f"{s}/step"))
    step.initializer.extend(
        [numpy_helper.from_array(weight, f"{s}/step/weight"), numpy_helper.from_array(bias, f"{s}/step/bias")]
    )
    return [
        helper.make_node("Shape", [x], [f"{s}/length"], name=f"{s}/Shape", start=1, end=2),
        helper.make_node("Greater", [f"{s}/length", one.name], [f"{s}/greater"], name=f"{s}/Greater"),
        helper.make_node("Squeeze", [f"{s}/greater"], [f"{s}/{SEVERAL_TOKENS}"], name=f"{s}/Squeeze"),
        helper.make_node(
            "If", [f"{s}/{SEVERAL_TOKENS}"], list(node.output), name=f"{s}/If", then_branch=prompt, else_branch=step
        ),
    ], one


def _prompt_constants(p: str, weight: Any, bias: Any) -> list[onnx.TensorProto]:
    import numpy as np
    from onnx import numpy_helper

    c, _, k = weight.shape
    values = {
        "weight": weight.reshape(c, 1, 1, k),
        "bias": bias,
        "axis1": np.array([1], np.int64),
        "kept": np.array([-(k - 1)], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
    }
    return [numpy_helper.from_array(v, f"{p}/{name}") for name, v in values.items()]


def _prompt_branch(x: str, state: str, p: str, weight: Any, silu: bool) -> list[onnx.NodeProto]:
    """Several tokens: the state's k-1 inputs and the tokens as [b, C, 1, k-1+l], one grouped
    Conv, the last k-1 inputs as the new state."""
    from onnx import helper

    c, k = weight.shape[0], weight.shape[-1]
    nodes = [
        helper.make_node("Transpose", [state], [f"{p}/past"], name=f"{p}/Transpose", perm=[0, 2, 1]),
        helper.make_node("Concat", [f"{p}/past", x], [f"{p}/inputs"], name=f"{p}/Concat", axis=1),
        helper.make_node("Unsqueeze", [f"{p}/inputs", f"{p}/axis1"], [f"{p}/rows"], name=f"{p}/Unsqueeze"),
        helper.make_node("Transpose", [f"{p}/rows"], [f"{p}/planes"], name=f"{p}/Transpose_1", perm=[0, 3, 1, 2]),
        helper.make_node(
            "Conv",
            [f"{p}/planes", f"{p}/weight", f"{p}/bias"],
            [f"{p}/conv"],
            name=f"{p}/Conv",
            group=c,
            kernel_shape=[1, k],
        ),
        helper.make_node("Transpose", [f"{p}/conv"], [f"{p}/conv_rows"], name=f"{p}/Transpose_2", perm=[0, 2, 3, 1]),
        helper.make_node(
            "Squeeze", [f"{p}/conv_rows", f"{p}/axis1"], [f"{p}/{'z' if silu else 'y'}"], name=f"{p}/Squeeze"
        ),
        helper.make_node(
            "Slice", [f"{p}/inputs", f"{p}/kept", f"{p}/end", f"{p}/axis1"], [f"{p}/last"], name=f"{p}/Slice"
        ),
        helper.make_node("Transpose", [f"{p}/last"], [f"{p}/state"], name=f"{p}/Transpose_3", perm=[0, 2, 1]),
    ]
    return nodes + (_silu(f"{p}/z", f"{p}/y", p) if silu else [])


def _step_branch(x: str, state: str, p: str, silu: bool) -> list[onnx.NodeProto]:
    """One token: onnxruntime's CausalConvWithState on [b, C, l]."""
    from onnx import helper

    nodes = [
        helper.make_node("Transpose", [x], [f"{p}/input"], name=f"{p}/Transpose", perm=[0, 2, 1]),
        helper.make_node(
            "CausalConvWithState",
            [f"{p}/input", f"{p}/weight", f"{p}/bias", state],
            [f"{p}/conv", f"{p}/state"],
            name=f"{p}/CausalConvWithState",
            domain="com.microsoft",
            activation="none",
        ),
        helper.make_node(
            "Transpose", [f"{p}/conv"], [f"{p}/{'z' if silu else 'y'}"], name=f"{p}/Transpose_1", perm=[0, 2, 1]
        ),
    ]
    return nodes + (_silu(f"{p}/z", f"{p}/y", p) if silu else [])


def _silu(z: str, y: str, p: str) -> list[onnx.NodeProto]:
    from onnx import helper

    return [
        helper.make_node("Sigmoid", [z], [f"{p}/sigmoid"], name=f"{p}/Sigmoid"),
        helper.make_node("Mul", [z, f"{p}/sigmoid"], [y], name=f"{p}/Mul"),
    ]


register(FusedOp("causal_conv", _translation, shapes={"CausalConv": _infer_shapes}, expand=expand_convs))
