"""`gated_delta`: the Gated DeltaNet rule S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t -
exp(g_t) S_{t-1}^T k_t)^T, o_t = S_t^T q_t (delta_scan.gated_delta_scan).

Glossary: b batch, l length, H heads, K key head dim, V value head dim.

In ONNX it is one `LinearAttention` node with update_rule "gated_delta" (q pre-scaled,
scale 1), whose state layout [b, H, K, V] is the contract's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..recurrences.delta_scan import gated_delta_scan
from . import linear_attention
from .registry import FusedOp, fusable, register

gated_delta = fusable("gated_delta", gated_delta_scan, like=(2, 5))


def _translation() -> Callable[..., Any]:
    from onnxscript import opset20

    op: Any = opset20  # onnxscript's stubs do not type python constants as tensors
    linear_attention_node = linear_attention.linear_attention_op()

    def gated_delta_onnx(q, k, v, g, beta, s0, chunk, max_len):  # type: ignore[no-untyped-def]
        H = v.shape[2]
        packed = op.Constant(value_ints=[0, 0, -1])
        y, state = linear_attention_node(
            op.Reshape(q, packed),
            op.Reshape(k, packed),
            op.Reshape(v, packed),
            s0,
            g,
            beta,
            update_rule="gated_delta",
            q_num_heads=H,
            kv_num_heads=H,
            scale=1.0,
        )
        return op.Reshape(y, op.Shape(v)), state

    return gated_delta_onnx


register(FusedOp("gated_delta", _translation, shapes={"LinearAttention": linear_attention.infer_shapes}))
