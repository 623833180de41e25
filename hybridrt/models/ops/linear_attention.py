"""onnxruntime's com.microsoft LinearAttention node, which ssd_scan and gated_delta become:
its schema for onnxscript and its shape rule for symbolic shape inference.

query, key [b, t, H K] and value [b, t, H V] packed per head, past_state [b, H, K, V], decay
[b, t, H], beta [b, t, H] (the delta rule's) -> output [b, t, H V], present_state [b, H, K, V].
"""

from __future__ import annotations

from typing import Any

import onnx


def linear_attention_op() -> Any:
    """The node as an onnxscript op: linear_attention(q, k, v, state, decay[, beta], update_rule=,
    q_num_heads=, kv_num_heads=, scale=) -> (output, present_state)."""
    from onnx.defs import OpSchema
    from onnxscript import values

    T = "T"
    schema = OpSchema(
        "LinearAttention",
        "com.microsoft",
        1,
        inputs=[
            OpSchema.FormalParameter("query", T),
            OpSchema.FormalParameter("key", T),
            OpSchema.FormalParameter("value", T),
            OpSchema.FormalParameter("past_state", T),
            OpSchema.FormalParameter("decay", T),
            OpSchema.FormalParameter("beta", T, param_option=OpSchema.FormalParameterOption.Optional),
        ],
        outputs=[OpSchema.FormalParameter("output", T), OpSchema.FormalParameter("present_state", T)],
        type_constraints=[(T, ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "")],
        attributes=[
            OpSchema.Attribute("update_rule", OpSchema.AttrType.STRING, ""),
            OpSchema.Attribute("q_num_heads", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, ""),
        ],
    )
    return values.Op(values.Opset("com.microsoft", 1), "LinearAttention", schema)


def infer_shapes(helper: Any, node: onnx.NodeProto) -> None:
    """output [b, t, max(q_heads, kv_heads) * dv] with dv = value's last dim / kv_heads (fewer
    query heads than kv heads serve each query to a block of kv heads); present_state = past_state."""
    from symbolic_shape_infer import get_attribute, get_shape_from_sympy_shape  # type: ignore[import-not-found]

    dtype = helper.known_vi_[node.input[0]].type.tensor_type.elem_type
    q, v = helper._get_sympy_shape(node, 0), helper._get_sympy_shape(node, 2)
    heads, kv_heads = get_attribute(node, "q_num_heads"), get_attribute(node, "kv_num_heads")
    shape = [q[0], q[1], v[2] * max(heads, kv_heads) // kv_heads]
    vi = helper.known_vi_[node.output[0]]
    vi.CopyFrom(onnx.helper.make_tensor_value_info(node.output[0], dtype, get_shape_from_sympy_shape(shape)))
    helper._propagate_shape_and_type(node, 3, 1)
