"""LFM2-MoE (`Lfm2MoeForCausalLM`): LFM2's short gated-conv and attention layers (per-head q/k
RMSNorm, RoPE) with a SwiGLU feed-forward in the first `num_dense_layers` layers and a
sigmoid-routed MoE after (expert bias for the choice only, renormalized, scaled)."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..registry import Family, register
from ..translate import eos_ids, rope_settings, unsupported

MODEL = "lfm2_moe"
LAYER_KINDS = {"conv": "conv", "full_attention": "attention"}


def translate(hf: dict[str, Any]) -> HybridConfig:
    kinds = hf.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != hf.get("num_hidden_layers", len(kinds)):
        raise unsupported(MODEL, "layer_types", kinds, "a list of conv/full_attention, one per layer")
    for kind in kinds:
        if kind not in LAYER_KINDS:
            raise unsupported(MODEL, "layer_types", kind, ", ".join(LAYER_KINDS))
    dense = hf.get("num_dense_layers", 2)
    d, heads = hf.get("hidden_size", 2048), hf.get("num_attention_heads", 32)
    return HybridConfig(
        model_type=MODEL,
        vocab_size=hf.get("vocab_size", 65536),
        hidden_size=d,
        layer_types=tuple(LAYER_KINDS[k] for k in kinds),
        ffn_types=tuple("mlp" if i < dense else "sigmoid_moe" for i in range(len(kinds))),
        intermediate_size=hf.get("intermediate_size", 7168),
        moe_intermediate_size=hf.get("moe_intermediate_size", 1792),
        num_experts=hf.get("num_experts", 32),
        num_experts_per_tok=hf.get("num_experts_per_tok", 4),
        moe_renormalize=bool(hf.get("norm_topk_prob", True)),
        moe_expert_bias=bool(hf.get("use_expert_bias", True)),
        moe_routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or d // heads,
        rms_norm_eps=hf.get("norm_eps", 1e-5),
        tie_word_embeddings=hf.get("tie_word_embeddings", hf.get("tie_embedding", True)),
        max_position_embeddings=hf.get("max_position_embeddings", 128000),
        qk_norm=True,
        conv_kernel=hf.get("conv_L_cache", 3),
        conv_bias=hf.get("conv_bias", False),
        bos_token_id=hf.get("bos_token_id", 1),
        eos_token_id=eos_ids(hf.get("eos_token_id", 2)),
        pad_token_id=hf.get("pad_token_id", 0),
        **rope_settings(MODEL, hf, default_theta=1000000.0),
    )


FAMILY = register(
    Family(
        model_type=MODEL,
        translate=translate,
        renames=(
            (r"^model\.embedding_norm\.", "model.norm."),
            (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
            (r"\.self_attn\.q_layernorm\.", ".self_attn.q_norm."),
            (r"\.self_attn\.k_layernorm\.", ".self_attn.k_norm."),
            (r"\.self_attn\.", ".mixer."),
            (r"^model\.layers\.(\d+)\.conv\.", r"model.layers.\1.mixer."),
            (r"\.operator_norm\.", ".input_norm."),
            # dense layers
            (r"\.feed_forward\.w1\.", ".ffn.gate_proj."),
            (r"\.feed_forward\.w3\.", ".ffn.up_proj."),
            (r"\.feed_forward\.w2\.", ".ffn.down_proj."),
            # released files keep one w1/w3/w2 per expert (stacked at load)
            (r"\.feed_forward\.experts\.(\d+)\.w1\.", r".ffn.experts.\1.gate_proj."),
            (r"\.feed_forward\.experts\.(\d+)\.w3\.", r".ffn.experts.\1.up_proj."),
            (r"\.feed_forward\.experts\.(\d+)\.w2\.", r".ffn.experts.\1.down_proj."),
            (r"\.feed_forward\.gate\.", ".ffn.router."),
            (r"\.feed_forward\.", ".ffn."),
        ),
        ignore=(r"rotary_emb\.inv_freq$",),
    )
)
