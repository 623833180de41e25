"""Granite 4.0 H (`GraniteMoeHybridForCausalLM`): Mamba2 and attention layers, each followed
by a shared-expert MLP, alone (dense) or beside a routed MoE; scalar multipliers on the
embeddings, the residual branches, the attention scores and the logits; RoPE or no positions."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..registry import Family, eos_ids, register, rope_settings, unsupported
from .mamba2 import check_silu, check_time_step_limit

# Released files spell the layer kinds "mamba"/"attention" (`layers_block_type`); newer
# transformers write "linear_attention"/"full_attention" (`layer_types`).
LAYER_KINDS = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "attention", "full_attention": "attention"}


def layer_kinds(model_type: str, hf: dict[str, Any], default: str) -> tuple[str, ...]:
    field = "layer_types" if hf.get("layer_types") is not None else "layers_block_type"
    kinds = hf.get(field) or [default] * hf.get("num_hidden_layers", 32)
    for kind in kinds:
        if kind not in LAYER_KINDS:
            raise unsupported(model_type, field, kind, ", ".join(LAYER_KINDS))
    return tuple(LAYER_KINDS[k] for k in kinds)


def mamba2_fields(model_type: str, hf: dict[str, Any], d: int) -> dict[str, Any]:
    """The `mamba_*` fields that Granite and Bamba share."""
    check_time_step_limit(model_type, hf)
    heads, expand = hf.get("mamba_n_heads", 128), hf.get("mamba_expand", 2)
    head_dim = hf.get("mamba_d_head", "auto")
    head_dim = expand * d // heads if head_dim == "auto" else int(head_dim)
    if head_dim * heads != expand * d:
        raise unsupported(model_type, "mamba_d_head", head_dim, "mamba_expand * hidden_size / mamba_n_heads")
    return {
        "mamba_d_state": hf.get("mamba_d_state", 256),
        "mamba_d_conv": hf.get("mamba_d_conv", 4),
        "mamba2_heads": heads,
        "mamba2_head_dim": head_dim,
        "mamba2_groups": hf.get("mamba_n_groups", 1),
        "mamba2_conv_bias": hf.get("mamba_conv_bias", True),
        "mamba2_proj_bias": hf.get("mamba_proj_bias", False),
    }


def translate(hf: dict[str, Any]) -> HybridConfig:
    check_silu("granitemoehybrid", hf)
    d = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    layer_types = layer_kinds("granitemoehybrid", hf, "linear_attention")
    experts = hf.get("num_local_experts", 8) or 0
    positions = hf.get("position_embedding_type")
    if positions not in (None, "rope"):
        raise unsupported("granitemoehybrid", "position_embedding_type", positions, "rope, null")
    rope = rope_settings("granitemoehybrid", hf) if positions == "rope" else {"rope_theta": None}
    return HybridConfig(
        model_type="granitemoehybrid",
        vocab_size=hf.get("vocab_size", 32000),
        hidden_size=d,
        layer_types=layer_types,
        ffn_types=("shared_moe" if experts > 0 else "shared_mlp",) * len(layer_types),
        intermediate_size=hf.get("intermediate_size", 11008),
        shared_intermediate_size=hf.get("shared_intermediate_size", 1024),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=d // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        attention_bias=hf.get("attention_bias", False),
        num_experts=max(experts, 1),
        num_experts_per_tok=hf.get("num_experts_per_tok", 2),
        moe_renormalize=True,
        embedding_multiplier=float(hf.get("embedding_multiplier") or 1.0),
        residual_multiplier=float(hf.get("residual_multiplier") or 1.0),
        attention_multiplier=float(hf.get("attention_multiplier") or 1.0),
        logits_scaling=float(hf.get("logits_scaling") or 1.0),
        bos_token_id=hf.get("bos_token_id", 1),
        eos_token_id=eos_ids(hf.get("eos_token_id", 2)),
        pad_token_id=hf.get("pad_token_id"),
        **mamba2_fields("granitemoehybrid", hf, d),
        **rope,
    )


FAMILY = register(
    Family(
        model_type="granitemoehybrid",
        translate=translate,
        renames=(
            (r"\.(mamba|self_attn)\.", ".mixer."),
            (r"\.input_layernorm\.", ".input_norm."),
            (r"\.post_attention_layernorm\.", ".ffn_norm."),
            (r"\.shared_mlp\.", ".ffn.shared."),
            # Released files: experts as input_linear/output_linear, router as router.layer.
            (r"\.block_sparse_moe\.input_linear\.weight$", ".ffn.moe.experts.gate_up_proj"),
            (r"\.block_sparse_moe\.output_linear\.weight$", ".ffn.moe.experts.down_proj"),
            (r"\.block_sparse_moe\.router\.layer\.", ".ffn.moe.router."),
            (r"\.block_sparse_moe\.", ".ffn.moe."),
        ),
        ignore=(r"rotary_emb\.inv_freq$",),
    )
)
