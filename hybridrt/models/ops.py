"""Fused-kernel seams: torch custom ops whose PyTorch body is the reference computation and
whose ONNX translation is an onnxruntime `com.microsoft` operator.

`selective_scan` is the Mamba1 recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t,
y_t = C_t h_t. Glossary: b batch, l length, H channels (d_inner), n d_state.
In ONNX it becomes an onnxruntime Scan over the tokens whose body is the one-token step
on the state as the contract stores it, [b, n, H] (export.fuse.expand_selective_scans, which
measures it against LinearAttention).
TorchScript and pt2 graphs keep the plain PyTorch path (no custom op inside), so that
LibTorch and ExecuTorch load them without hybridrt.

`ssd_scan` is the Mamba2 recurrence h_t = exp(g_t) h_{t-1} + x_t B_t^T, y_t = h_t C_t with
a scalar decay g per head; in ONNX it is one `LinearAttention` node with a decay of shape
[b, l, H] (k = B, v = dt x, q = C, scale 1), fed in the packed [b, l, channels] layout with
constant shapes. The contract keeps the state in that node's layout, [b, H, n, P], so a step
transposes nothing; the PyTorch scan works in [b, H, P, n].

`gated_delta` is the Gated DeltaNet rule S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t -
exp(g_t) S_{t-1}^T k_t)^T, o_t = S_t^T q_t (delta_scan.gated_delta_scan); in ONNX it is one
`LinearAttention` node with update_rule "gated_delta" (q pre-scaled, scale 1), whose state
layout [b, H, K, V] is the contract's.

`kv_attention` is causal grouped-query attention over fixed-size KV buffers: the new keys
and values are written at each row's own past length, and each query reads the positions
before it. In ONNX it is one `GroupQueryAttention` node whose past and present are the same
buffer (the runtime binds one OrtValue to both), so a decode step copies no KV.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from .context import MixerContext
from .delta_scan import gated_delta_scan as _gated_delta_reference
from .scan import linear_scan
from .scan import ssd_scan as _ssd_reference

_FUSED = False
# The domain of export-time placeholders that export.fuse expands before the graph is saved.
SCAN_DOMAIN = "hybridrt.export"


@contextlib.contextmanager
def fused_ops() -> Iterator[None]:
    """Within this block, mixers call the custom ops (for ONNX export)."""
    global _FUSED
    previous, _FUSED = _FUSED, True
    try:
        yield
    finally:
        _FUSED = previous


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
    """xdt, dt [b, l, H], A [n, H], B, C [b, l, n], h0 [b, n, H] -> y [b, l, H], h [b, n, H]."""
    u = B.unsqueeze(-1) * xdt.unsqueeze(2)  # [b, l, n, H]
    decay = torch.exp(dt.unsqueeze(2) * A)
    h, last = linear_scan(decay, u, h0, chunk, max_len)
    return (h * C.unsqueeze(-1)).sum(2), last


@torch.library.custom_op("hybridrt::selective_scan", mutates_args=())
def _selective_scan_op(
    xdt: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    h0: torch.Tensor,
    chunk: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    y, h = _scan_reference(xdt, dt, A, B, C, h0, chunk, max_len)
    return y.contiguous(), h.contiguous()


@_selective_scan_op.register_fake
def _(xdt, dt, A, B, C, h0, chunk, max_len):  # type: ignore[no-untyped-def]
    return torch.empty_like(xdt), torch.empty_like(h0)


def selective_scan(
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
    if _FUSED:
        return _selective_scan_op(xdt, dt, A, B, C, h0, chunk, max_len)
    return _scan_reference(xdt, dt, A, B, C, h0, chunk, max_len)


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
    b, l = xs.shape[0], xs.shape[1]
    H, n, P = h0.shape[1], h0.shape[2], h0.shape[3]
    G = B.shape[-1] // n

    def heads(t: torch.Tensor) -> torch.Tensor:  # [b, l, G n] -> [b, l, H, n]: a group serves H / G heads
        return t.view(b, l, G, 1, n).expand(b, l, G, H // G, n).reshape(b, l, H, n)

    xdt = xs.view(b, l, H, P) * dt.unsqueeze(-1)
    y, h = _ssd_reference(xdt, dt * A, heads(B), heads(C), h0.transpose(-1, -2), chunk, max_len)
    return y.reshape(b, l, H * P), h.transpose(-1, -2)


@torch.library.custom_op("hybridrt::ssd_scan", mutates_args=())
def _ssd_scan_op(
    xs: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    h0: torch.Tensor,
    chunk: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    y, h = _ssd_packed(xs, dt, A, B, C, h0, chunk, max_len)
    return y.contiguous(), h.contiguous()


@_ssd_scan_op.register_fake
def _(xs, dt, A, B, C, h0, chunk, max_len):  # type: ignore[no-untyped-def]
    return torch.empty_like(xs), torch.empty_like(h0)


def ssd_scan(
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
    if _FUSED:
        return _ssd_scan_op(xs, dt, A, B, C, h0, chunk, max_len)
    return _ssd_packed(xs, dt, A, B, C, h0, chunk, max_len)


@torch.library.custom_op("hybridrt::gated_delta", mutates_args=())
def _gated_delta_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s0: torch.Tensor,
    chunk: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    o, s = _gated_delta_reference(q, k, v, g, beta, s0, chunk, max_len)
    return o.contiguous(), s.contiguous()


@_gated_delta_op.register_fake
def _(q, k, v, g, beta, s0, chunk, max_len):  # type: ignore[no-untyped-def]
    return torch.empty_like(v), torch.empty_like(s0)


def gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s0: torch.Tensor,
    chunk: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [b, l, H, K], v [b, l, H, V], g, beta [b, l, H], s0 [b, H, K, V] -> o [b, l, H, V], s [b, H, K, V]."""
    if _FUSED:
        return _gated_delta_op(q, k, v, g, beta, s0, chunk, max_len)
    return _gated_delta_reference(q, k, v, g, beta, s0, chunk, max_len)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv continuing from a state, then SiLU if `silu`.

    x [b, C, l], conv_state [b, C, k-1] (the last k-1 inputs), weight [C, 1, k] ->
    (y [b, C, l], new state [b, C, k-1]). In ONNX: one com.microsoft CausalConvWithState
    node (activation fused) instead of Concat, Conv, Slice and the activation.
    """
    if _FUSED:
        if bias is None:
            bias = weight.new_zeros(weight.shape[0])
        return _causal_conv_op(x, conv_state, weight, bias, silu)
    return _causal_conv_reference(x, conv_state, weight, bias, silu)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, h, l, hd], cos/sin [b, 1, l, rd]: rotate the first rd dims, pass the rest."""
    rd = cos.shape[-1]
    if rd == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


def _rope_at(cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A [max_len, rd/2] table at positions pos [b, l] -> [b, 1, l, rd] (both halves)."""
    half = cache[pos]
    return torch.cat([half, half], dim=-1).unsqueeze(1)


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention of q [b, h, l, hd] over k, v [b, h_kv, t, hd] with an additive
    bias [b, 1, l, t] -> [b, l, h hd]. No K/V copy per query head: the query heads of one
    KV head are stacked along the query axis ([b, h_kv, rep*l, hd])."""
    b, h, l, hd = q.shape
    h_kv = k.shape[1]
    rep = h // h_kv
    qg = q.reshape(b, h_kv, rep * l, hd)
    scores = torch.matmul(qg, k.transpose(2, 3)) * scale  # [b, h_kv, rep*l, t]
    scores = scores.view(b, h_kv, rep, l, -1) + bias.unsqueeze(1)
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(b, h_kv, rep * l, -1)
    return torch.matmul(probs, v).view(b, h, l, hd).transpose(1, 2).reshape(b, l, h * hd)


def _kv_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    past_lengths: torch.Tensor,
    scale: float,
    cos_cache: torch.Tensor | None = None,
    sin_cache: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [b, h, l, hd], k, v [b, h_kv, l, hd], past_k/v [b, h_kv, C, hd], past_lengths [b]
    -> (y [b, l, h hd], present_k/v [b, h_kv, C, hd]); with the rotary tables, q and k are
    rotated here at their positions."""
    b, h_kv, l, hd = k.shape
    pos = past_lengths.unsqueeze(1) + torch.arange(l, device=k.device)  # [b, l] absolute positions
    if cos_cache is not None and sin_cache is not None:
        cos, sin = _rope_at(cos_cache, pos), _rope_at(sin_cache, pos)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    index = pos[:, None, :, None].expand(b, h_kv, l, hd)
    present_k, present_v = past_k.scatter(2, index, k), past_v.scatter(2, index, v)
    # Query at position p sees keys 0..p; a finite minimum (not -inf) keeps the softmax NaN-free.
    cols = torch.arange(past_k.shape[2], device=k.device)
    allowed = cols[None, None, :] <= pos[:, :, None]  # [b, l, C]
    bias = torch.where(allowed, 0.0, torch.finfo(torch.float32).min).unsqueeze(1)
    return grouped_attention(q, present_k, present_v, bias, scale), present_k, present_v


def attention_lengths(past_lengths: torch.Tensor, l: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What GroupQueryAttention reads besides q, k, v, for a call of l new tokens per row after
    past_lengths [b]: seqlens_k = tokens after the call - 1 [b], the total (an upper bound:
    the longest row) [], query_seqlens = new tokens per row [b], all int32. Computed once per
    call and shared by every attention layer."""
    after = past_lengths + l
    return (after - 1).to(torch.int32), after.max().to(torch.int32), (after - past_lengths).to(torch.int32)


@torch.library.custom_op("hybridrt::kv_attention", mutates_args=())
def _kv_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    seqlens_k: torch.Tensor,
    total: torch.Tensor,
    query_seqlens: torch.Tensor,
    scale: float,
    cos_cache: torch.Tensor | None,
    sin_cache: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [b, l, h hd], k, v [b, l, h_kv hd] (token-major, as GroupQueryAttention takes them);
    the lengths as attention_lengths gives them."""
    b, l, _ = q.shape
    h_kv, hd = past_k.shape[1], past_k.shape[3]
    heads = q.shape[2] // hd
    past_lengths = seqlens_k.long() + 1 - query_seqlens.long()
    y, pk, pv = _kv_attention_reference(
        q.view(b, l, heads, hd).transpose(1, 2),
        k.view(b, l, h_kv, hd).transpose(1, 2),
        v.view(b, l, h_kv, hd).transpose(1, 2),
        past_k,
        past_v,
        past_lengths,
        scale,
        cos_cache,
        sin_cache,
    )
    return y.contiguous(), pk.contiguous(), pv.contiguous()


@_kv_attention_op.register_fake
def _(q, k, v, past_k, past_v, seqlens_k, total, query_seqlens, scale, cos_cache, sin_cache):  # type: ignore[no-untyped-def]
    return torch.empty_like(q), torch.empty_like(past_k), torch.empty_like(past_v)


# onnxruntime's CPU GroupQueryAttention takes head sizes that are multiples of 8; other
# sizes keep the plain-op attention (same contract, KV written by ScatterElements). Its
# rotary needs head and rotary sizes that are multiples of 16; otherwise q and k are rotated
# before the node.
GQA_HEAD_MULTIPLE = 8
GQA_ROTARY_MULTIPLE = 16


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    ctx: MixerContext,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv_attention for a mixer, token-major: q [b, l, h hd], k, v [b, l, h_kv hd], not yet
    rotated; the rotary of ctx (if any) is applied here, inside the fused operator where it
    can run there. Returns (y [b, l, h hd], present_k, present_v)."""
    assert ctx.past_lengths is not None, "attention needs past_lengths"
    b, l, _ = q.shape
    h_kv, hd = past_k.shape[1], past_k.shape[3]
    tables = ctx.rope_cache
    rotate_inside = (
        tables is not None and hd % GQA_ROTARY_MULTIPLE == 0 and (2 * tables[0].shape[-1]) % GQA_ROTARY_MULTIPLE == 0
    )
    if _FUSED and hd % GQA_HEAD_MULTIPLE == 0 and (rotate_inside or ctx.cos is None):
        # Token-major straight into the operator: no reshapes, lengths shared by every layer.
        seqlens_k, total, query_seqlens = ctx.lengths or attention_lengths(ctx.past_lengths, l)
        cos_cache, sin_cache = tables if rotate_inside and tables is not None else (None, None)
        return _kv_attention_op(q, k, v, past_k, past_v, seqlens_k, total, query_seqlens, scale, cos_cache, sin_cache)
    q4 = q.view(b, l, q.shape[-1] // hd, hd).transpose(1, 2)
    k4, v4 = k.view(b, l, h_kv, hd).transpose(1, 2), v.view(b, l, h_kv, hd).transpose(1, 2)
    if rotate_inside and _FUSED and hd % GQA_HEAD_MULTIPLE == 0:
        return kv_attention(q4, k4, v4, past_k, past_v, ctx.past_lengths, scale, tables)
    if ctx.cos is not None and ctx.sin is not None:
        cos, sin = ctx.cos.unsqueeze(1), ctx.sin.unsqueeze(1)
        q4, k4 = apply_rope(q4, cos, sin), apply_rope(k4, cos, sin)
    return kv_attention(q4, k4, v4, past_k, past_v, ctx.past_lengths, scale, None)


def kv_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    past_lengths: torch.Tensor,
    scale: float,
    tables: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal attention of the new tokens over each row's KV buffer.

    q [b, h, l, hd] and k, v [b, h_kv, l, hd], past_k/past_v [b, h_kv, C, hd] holding
    past_lengths[r] positions of row r -> (y [b, l, h hd], present_k, present_v [b, h_kv, C, hd])
    with the new keys and values at past_lengths .. +l-1. With `tables` (cos, sin of every
    position), q and k are rotated here (inside GroupQueryAttention when fused); without, they
    come rotated. Positions past a row's length are never read, so a buffer needs no clearing.
    """
    cos_cache, sin_cache = tables if tables is not None else (None, None)
    b, h, l, hd = q.shape
    if _FUSED and hd % GQA_HEAD_MULTIPLE == 0:
        h_kv = k.shape[1]
        return _kv_attention_op(
            q.transpose(1, 2).reshape(b, l, h * hd),
            k.transpose(1, 2).reshape(b, l, h_kv * hd),
            v.transpose(1, 2).reshape(b, l, h_kv * hd),
            past_k,
            past_v,
            *attention_lengths(past_lengths, l),
            scale,
            cos_cache,
            sin_cache,
        )
    return _kv_attention_reference(q, k, v, past_k, past_v, past_lengths, scale, cos_cache, sin_cache)


def onnx_translations() -> dict[object, object]:
    """custom_translation_table entries for torch.onnx.export."""
    from onnx.defs import OpSchema
    from onnxscript import opset20, values

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
    op: Any = opset20  # onnxscript's stubs do not type python constants as tensors
    linear_attention = values.Op(values.Opset("com.microsoft", 1), "LinearAttention", schema)

    scan_schema = OpSchema(
        "SelectiveScan",
        SCAN_DOMAIN,
        1,
        inputs=[OpSchema.FormalParameter(n, T) for n in ("xdt", "dt", "A", "B", "C", "past_state")],
        outputs=[OpSchema.FormalParameter("output", T), OpSchema.FormalParameter("present_state", T)],
        type_constraints=[(T, ["tensor(float)"], "")],
        attributes=[OpSchema.Attribute("heads", OpSchema.AttrType.INT, "")],
    )
    scan_node = values.Op(values.Opset(SCAN_DOMAIN, 1), "SelectiveScan", scan_schema)

    def selective_scan_onnx(xdt, dt, A, B, C, h0, chunk, max_len):  # type: ignore[no-untyped-def]
        # A placeholder that export.fuse.expand_selective_scans replaces by a Scan.
        return scan_node(xdt, dt, A, B, C, h0, heads=xdt.shape[2])

    def ssd_scan_onnx(xs, dt, A, B, C, h0, chunk, max_len):  # type: ignore[no-untyped-def]
        # Everything in the packed [b, l, channels] layout LinearAttention takes: no shape is
        # computed at run time, and one group's B and C are tiled to its heads.
        H, n, P = h0.shape[1], h0.shape[2], h0.shape[3]
        G = B.shape[2] // n
        packed = op.Constant(value_ints=[0, 0, -1])
        xdt = op.Reshape(op.Mul(op.Reshape(xs, op.Constant(value_ints=[0, 0, H, P])), op.Unsqueeze(dt, [3])), packed)
        if G == 1:
            heads = op.Constant(value_ints=[1, 1, H])
            q, k = op.Tile(C, heads), op.Tile(B, heads)
        else:
            grouped, tile = op.Constant(value_ints=[0, 0, G, 1, n]), op.Constant(value_ints=[1, 1, 1, H // G, 1])
            q = op.Reshape(op.Expand(op.Reshape(C, grouped), tile), packed)
            k = op.Reshape(op.Expand(op.Reshape(B, grouped), tile), packed)
        y, state = linear_attention(
            q, k, xdt, h0, op.Mul(dt, A), update_rule="gated", q_num_heads=H, kv_num_heads=H, scale=1.0
        )
        return y, state

    def gated_delta_onnx(q, k, v, g, beta, s0, chunk, max_len):  # type: ignore[no-untyped-def]
        H = v.shape[2]
        packed = op.Constant(value_ints=[0, 0, -1])
        y, state = linear_attention(
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

    conv_schema = OpSchema(
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
    conv_with_state = values.Op(values.Opset("com.microsoft", 1), "CausalConvWithState", conv_schema)

    def causal_conv_onnx(x, conv_state, weight, bias, silu):  # type: ignore[no-untyped-def]
        return conv_with_state(x, weight, bias, conv_state, activation="silu" if silu else "none")

    M = "M"
    gqa_inputs = [
        ("query", T, False),
        ("key", T, True),
        ("value", T, True),
        ("past_key", T, True),
        ("past_value", T, True),
        ("seqlens_k", M, False),
        ("total_sequence_length", M, False),
        ("cos_cache", T, True),
        ("sin_cache", T, True),
        ("position_ids", "P", True),
        ("attention_bias", T, True),
        ("head_sink", T, True),
        ("k_scale", T, True),
        ("v_scale", T, True),
        ("q_norm_weight", T, True),
        ("k_norm_weight", T, True),
        ("query_seqlens", M, True),
    ]
    optional = OpSchema.FormalParameterOption.Optional
    gqa_schema = OpSchema(
        "GroupQueryAttention",
        "com.microsoft",
        1,
        inputs=[
            OpSchema.FormalParameter(n, t, param_option=optional) if opt else OpSchema.FormalParameter(n, t)
            for n, t, opt in gqa_inputs
        ],
        outputs=[
            OpSchema.FormalParameter("output", T),
            OpSchema.FormalParameter("present_key", T),
            OpSchema.FormalParameter("present_value", T),
        ],
        type_constraints=[
            (T, ["tensor(float)", "tensor(float16)"], ""),
            (M, ["tensor(int32)"], ""),
            ("P", ["tensor(int64)"], ""),
        ],
        attributes=[
            OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, ""),
            OpSchema.Attribute("do_rotary", OpSchema.AttrType.INT, ""),
        ],
    )
    group_query_attention = values.Op(values.Opset("com.microsoft", 1), "GroupQueryAttention", gqa_schema)

    def kv_attention_onnx(q, k, v, past_k, past_v, seqlens_k, total, query_seqlens, scale, cos_cache, sin_cache):  # type: ignore[no-untyped-def]
        h_kv, hd = past_k.shape[1], past_k.shape[3]
        heads = q.shape[2] // hd
        return group_query_attention(
            q,
            k,
            v,
            past_k,
            past_v,
            seqlens_k,
            total,
            cos_cache,
            sin_cache,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            query_seqlens,
            num_heads=heads,
            kv_num_heads=h_kv,
            scale=scale,
            do_rotary=0 if cos_cache is None else 1,
        )

    def softplus_onnx(x, beta=1.0, threshold=20.0):  # type: ignore[no-untyped-def]
        # onnxruntime's Softplus is stable for large inputs and within 1e-9 of torch's
        # thresholded one, so the Greater/Where of torch's decomposition are not needed.
        if beta == 1.0:
            return op.Softplus(x)
        return op.Div(op.Softplus(op.Mul(x, beta)), beta)

    return {
        torch.ops.aten.softplus.default: softplus_onnx,
        torch.ops.hybridrt.causal_conv.default: causal_conv_onnx,
        torch.ops.hybridrt.gated_delta.default: gated_delta_onnx,
        torch.ops.hybridrt.kv_attention.default: kv_attention_onnx,
        torch.ops.hybridrt.selective_scan.default: selective_scan_onnx,
        torch.ops.hybridrt.ssd_scan.default: ssd_scan_onnx,
    }
