"""Jamba (`JambaForCausalLM`): Mamba1 with dt/B/C norms, attention every `attn_layer_period`
layers without positions, MoE feed-forward every `expert_layer_period` layers."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.registry import Family, register
from ..loading.translate import special_tokens, unsupported


def translate(hf: dict[str, Any]) -> HybridConfig:
    n = hf.get("num_hidden_layers", 32)
    period, offset = hf.get("attn_layer_period", 8), hf.get("attn_layer_offset", 4)
    e_period, e_offset = hf.get("expert_layer_period", 2), hf.get("expert_layer_offset", 1)
    experts = hf.get("num_experts", hf.get("num_local_experts", 16))
    if hf.get("hidden_act", "silu") != "silu":
        raise unsupported("jamba", "hidden_act", hf["hidden_act"], "silu")
    layer_types = tuple("attention" if i % period == offset else "mamba" for i in range(n))
    ffn_types = tuple("moe" if experts > 1 and i % e_period == e_offset else "mlp" for i in range(n))
    d = hf.get("hidden_size", 4096)
    dt_rank = hf.get("mamba_dt_rank", "auto")
    heads = hf.get("num_attention_heads", 32)
    return HybridConfig.make(  # mamba_inner_norms: kinds.MambaParams
        model_type="jamba",
        vocab_size=hf.get("vocab_size", 65536),
        hidden_size=d,
        layer_types=layer_types,
        ffn_types=ffn_types,
        intermediate_size=hf.get("intermediate_size", 14336),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or 8,
        head_dim=d // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=hf.get("max_position_embeddings", 262144),
        rope_theta=None,
        mamba_d_state=hf.get("mamba_d_state", 16),
        mamba_d_conv=hf.get("mamba_d_conv", 4),
        mamba_expand=hf.get("mamba_expand", 2),
        mamba_dt_rank=-(-d // 16) if dt_rank == "auto" else int(dt_rank),
        mamba_conv_bias=hf.get("mamba_conv_bias", True),
        mamba_proj_bias=hf.get("mamba_proj_bias", False),
        mamba_inner_norms=True,
        num_experts=experts,
        num_experts_per_tok=hf.get("num_experts_per_tok", 2),
        **special_tokens(hf, bos=1, eos=2, pad=0),
    )


FAMILY = register(
    Family(
        model_type="jamba",
        translate=translate,
        renames=(
            (r"^model\.final_layernorm\.", "model.norm."),
            (r"\.(mamba|self_attn)\.", ".mixer."),
            (r"\.feed_forward\.", ".ffn."),
            (r"\.input_layernorm\.", ".input_norm."),
            (r"\.pre_ff_layernorm\.", ".ffn_norm."),
            (r"\.dt_layernorm\.", ".dt_norm."),
            (r"\.b_layernorm\.", ".b_norm."),
            (r"\.c_layernorm\.", ".c_norm."),
        ),
    )
)
