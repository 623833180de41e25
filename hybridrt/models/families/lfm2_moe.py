"""LFM2-MoE (`Lfm2MoeForCausalLM`): LFM2's short gated-conv and attention layers (per-head q/k
RMSNorm, RoPE) with a SwiGLU feed-forward in the first `num_dense_layers` layers and a
sigmoid-routed MoE after (expert bias for the choice only, renormalized, scaled)."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import LFM2_RENAMES, ROTARY_CACHE
from ..loading.registry import Family, register
from ..loading.translate import LFM2_LAYER_KINDS, lfm2_fields, unsupported

MODEL = "lfm2_moe"


def translate(hf: dict[str, Any]) -> HybridConfig:
    kinds = hf.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != hf.get("num_hidden_layers", len(kinds)):
        raise unsupported(MODEL, "layer_types", kinds, "a list of conv/full_attention, one per layer")
    for kind in kinds:
        if kind not in LFM2_LAYER_KINDS:
            raise unsupported(MODEL, "layer_types", kind, ", ".join(LFM2_LAYER_KINDS))
    dense = hf.get("num_dense_layers", 2)
    d, heads = hf.get("hidden_size", 2048), hf.get("num_attention_heads", 32)
    return HybridConfig.make(  # the experts: ffn_kinds.MoEParams
        model_type=MODEL,
        vocab_size=hf.get("vocab_size", 65536),
        hidden_size=d,
        layer_types=tuple(LFM2_LAYER_KINDS[k] for k in kinds),
        ffn_types=tuple("mlp" if i < dense else "sigmoid_moe" for i in range(len(kinds))),
        intermediate_size=hf.get("intermediate_size", 7168),
        moe_intermediate_size=hf.get("moe_intermediate_size", 1792),
        num_experts=hf.get("num_experts", 32),
        num_experts_per_tok=hf.get("num_experts_per_tok", 4),
        moe_renormalize=bool(hf.get("norm_topk_prob", True)),
        moe_expert_bias=bool(hf.get("use_expert_bias", True)),
        moe_routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
        head_dim=hf.get("head_dim") or d // heads,
        **lfm2_fields(MODEL, hf, heads),
    )


FAMILY = register(
    Family(
        model_type=MODEL,
        translate=translate,
        renames=LFM2_RENAMES
        + (
            # released files keep one w1/w3/w2 per expert (stacked at load)
            (r"\.feed_forward\.experts\.(\d+)\.w1\.", r".ffn.experts.\1.gate_proj."),
            (r"\.feed_forward\.experts\.(\d+)\.w3\.", r".ffn.experts.\1.up_proj."),
            (r"\.feed_forward\.experts\.(\d+)\.w2\.", r".ffn.experts.\1.down_proj."),
            (r"\.feed_forward\.gate\.", ".ffn.router."),
            (r"\.feed_forward\.", ".ffn."),
        ),
        ignore=ROTARY_CACHE,
    )
)
