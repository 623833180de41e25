"""`ssd_scan`: the Mamba2 recurrence h_t = exp(g_t) h_{t-1} + x_t B_t^T, y_t = h_t C_t with a
scalar decay g per head.

Glossary: b batch, l length, H heads, P head_dim, G groups (B and C are shared by the H / G
heads of a group), n d_state.

In ONNX it is one `LinearAttention` node with a decay of shape [b, l, H] (k = B and q = C with
one head per group, v = dt x, scale 1), fed in the packed [b, l, channels] layout with
constant shapes. The contract
keeps the state in that node's layout, [b, H, n, P], so a step transposes nothing; the
PyTorch scan works in [b, H, P, n].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..recurrences.scan import ssd_scan as _ssd_reference
from . import linear_attention
from .registry import FusedOp, fusable, register


def _ssd_packed(
    xs: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    h0: torch.Tensor,
    chunk: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Mamba2 scan on packed channels: xs [b, l, H P], dt [b, l, H], A [H], B, C [b, l, G n],
    h0 [b, H, n, P] -> y [b, l, H P] (without the D skip), h [b, H, n, P].

    Head h reads x channels h P .. h P + P - 1 and the B and C of group h // (H / G); the
    state layout is the graph contract's. scan.ssd_scan computes it in [b, H, P, n]."""
    b, l = xs.shape[0], xs.shape[1]
    H, n, P = h0.shape[1], h0.shape[2], h0.shape[3]
    G = B.shape[-1] // n

    def heads(t: torch.Tensor) -> torch.Tensor:  # [b, l, G n] -> [b, l, H, n]: a group serves H / G heads
        return t.view(b, l, G, 1, n).expand(b, l, G, H // G, n).reshape(b, l, H, n)

    xdt = xs.view(b, l, H, P) * dt.unsqueeze(-1)
    y, h = _ssd_reference(xdt, dt * A, heads(B), heads(C), h0.transpose(-1, -2), chunk, max_len)
    return y.reshape(b, l, H * P), h.transpose(-1, -2)


ssd_scan = fusable("ssd_scan", _ssd_packed, like=(0, 5))


def _translation() -> Callable[..., Any]:
    from onnxscript import opset20

    op: Any = opset20  # onnxscript's stubs do not type python constants as tensors
    linear_attention_node = linear_attention.linear_attention_op()

    def ssd_scan_onnx(xs, dt, A, B, C, h0, chunk, max_len):  # type: ignore[no-untyped-def]
        # Everything in the packed [b, l, channels] layout LinearAttention takes, with constant
        # shapes. dt scales x (the value, P channels a head) rather than B, so that B and C stay
        # one key and one query per group: the node serves each group's key and query to its
        # H / G heads itself (G key and query heads < kv_num_heads H), and nothing is tiled.
        H = h0.shape[1]
        G = B.shape[2] // h0.shape[2]
        xdt = op.Mul(op.Reshape(xs, op.Constant(value_ints=[0, 0, H, -1])), op.Unsqueeze(dt, [3]))
        y, state = linear_attention_node(
            C,
            B,
            op.Reshape(xdt, op.Constant(value_ints=[0, 0, -1])),
            h0,
            op.Mul(dt, A),
            update_rule="gated",
            q_num_heads=G,
            kv_num_heads=H,
            scale=1.0,
        )
        return y, state

    return ssd_scan_onnx


register(FusedOp("ssd_scan", _translation, shapes={"LinearAttention": linear_attention.infer_shapes}))
