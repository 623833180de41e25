"""`kv_attention`: causal grouped-query attention over fixed-size KV buffers. The new keys and
values are written at each row's own past length, and each query reads the positions before
it.

Glossary: b batch, l new tokens, h query heads, h_kv key/value heads, hd head dim, C KV
capacity, rd rotary dims.

In ONNX it is one `GroupQueryAttention` node whose past and present are the same buffer (the
runtime binds one OrtValue to both), so a decode step copies no KV.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..context import MixerContext
from .registry import FusedOp, register

# onnxruntime's CPU GroupQueryAttention takes head sizes that are multiples of 8; other
# sizes keep the plain-op attention (same contract, KV written by ScatterElements). Its
# rotary needs head and rotary sizes that are multiples of 16; otherwise q and k are rotated
# before the node.
GQA_HEAD_MULTIPLE = 8
GQA_ROTARY_MULTIPLE = 16


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


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    ctx: MixerContext,
    scale: float,
    *,
    fused: bool = False,
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
    if fused and hd % GQA_HEAD_MULTIPLE == 0 and (rotate_inside or ctx.cos is None):
        # Token-major straight into the operator: no reshapes, lengths shared by every layer.
        seqlens_k, total, query_seqlens = ctx.lengths or attention_lengths(ctx.past_lengths, l)
        cos_cache, sin_cache = tables if rotate_inside and tables is not None else (None, None)
        return _kv_attention_op(q, k, v, past_k, past_v, seqlens_k, total, query_seqlens, scale, cos_cache, sin_cache)
    q4 = q.view(b, l, q.shape[-1] // hd, hd).transpose(1, 2)
    k4, v4 = k.view(b, l, h_kv, hd).transpose(1, 2), v.view(b, l, h_kv, hd).transpose(1, 2)
    if rotate_inside and fused and hd % GQA_HEAD_MULTIPLE == 0:
        return kv_attention(q4, k4, v4, past_k, past_v, ctx.past_lengths, scale, tables, fused=fused)
    if ctx.cos is not None and ctx.sin is not None:
        cos, sin = ctx.cos.unsqueeze(1), ctx.sin.unsqueeze(1)
        q4, k4 = apply_rope(q4, cos, sin), apply_rope(k4, cos, sin)
    return kv_attention(q4, k4, v4, past_k, past_v, ctx.past_lengths, scale, None, fused=fused)


def kv_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    past_lengths: torch.Tensor,
    scale: float,
    tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    fused: bool = False,
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
    if fused and hd % GQA_HEAD_MULTIPLE == 0:
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


# GroupQueryAttention's inputs in order: (name, type, optional).
_GQA_INPUTS = [
    ("query", "T", False),
    ("key", "T", True),
    ("value", "T", True),
    ("past_key", "T", True),
    ("past_value", "T", True),
    ("seqlens_k", "M", False),
    ("total_sequence_length", "M", False),
    ("cos_cache", "T", True),
    ("sin_cache", "T", True),
    ("position_ids", "P", True),
    ("attention_bias", "T", True),
    ("head_sink", "T", True),
    ("k_scale", "T", True),
    ("v_scale", "T", True),
    ("q_norm_weight", "T", True),
    ("k_norm_weight", "T", True),
    ("query_seqlens", "M", True),
]


def _translation() -> Callable[..., Any]:
    from onnx.defs import OpSchema
    from onnxscript import values

    optional = OpSchema.FormalParameterOption.Optional
    schema = OpSchema(
        "GroupQueryAttention",
        "com.microsoft",
        1,
        inputs=[
            OpSchema.FormalParameter(n, t, param_option=optional) if opt else OpSchema.FormalParameter(n, t)
            for n, t, opt in _GQA_INPUTS
        ],
        outputs=[
            OpSchema.FormalParameter("output", "T"),
            OpSchema.FormalParameter("present_key", "T"),
            OpSchema.FormalParameter("present_value", "T"),
        ],
        type_constraints=[
            ("T", ["tensor(float)", "tensor(float16)"], ""),
            ("M", ["tensor(int32)"], ""),
            ("P", ["tensor(int64)"], ""),
        ],
        attributes=[
            OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, ""),
            OpSchema.Attribute("do_rotary", OpSchema.AttrType.INT, ""),
        ],
    )
    group_query_attention = values.Op(values.Opset("com.microsoft", 1), "GroupQueryAttention", schema)

    def kv_attention_onnx(q, k, v, past_k, past_v, seqlens_k, total, query_seqlens, scale, cos_cache, sin_cache):  # type: ignore[no-untyped-def]
        h_kv, hd = past_k.shape[1], past_k.shape[3]
        heads = q.shape[2] // hd
        skipped = [None] * 7  # position_ids .. k_norm_weight
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
            *skipped,
            query_seqlens,
            num_heads=heads,
            kv_num_heads=h_kv,
            scale=scale,
            do_rotary=0 if cos_cache is None else 1,
        )

    return kv_attention_onnx


# onnxruntime's symbolic shape inference knows GroupQueryAttention: no shape rule.
register(FusedOp("kv_attention", _translation))
