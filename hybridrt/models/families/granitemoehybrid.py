"""Granite 4.0 H (`GraniteMoeHybridForCausalLM`): Mamba2 and attention layers, each followed
by a shared-expert MLP, alone (dense) or beside a routed MoE; scalar multipliers on the
embeddings, the residual branches, the attention scores and the logits; RoPE or no positions
(`position_embedding_type` "nope" or null)."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import JAMBA_MIXER, LLAMA_NORMS, ROTARY_CACHE
from ..loading.registry import Family, register
from ..loading.translate import (
    check_silu,
    decoder_fields,
    layer_kinds,
    mamba2_fields,
    rope_settings,
    special_tokens,
    unsupported,
)

# `position_embedding_type`: "rope", or no positions ("nope" in the released files, or null).
POSITION_TYPES = (None, "rope", "nope")


def translate(hf: dict[str, Any]) -> HybridConfig:
    check_silu("granitemoehybrid", hf)
    d = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    layer_types = layer_kinds("granitemoehybrid", hf, "linear_attention")
    experts = hf.get("num_local_experts", 8) or 0
    # transformers builds the rotary embedding only for "rope"; the released files spell "no
    # positions" as "nope" (the Granite 4.0 H models) or leave the field out.
    positions = hf.get("position_embedding_type")
    if positions not in POSITION_TYPES:
        raise unsupported("granitemoehybrid", "position_embedding_type", positions, "rope, nope, null")
    rope = rope_settings("granitemoehybrid", hf) if positions == "rope" else {"rope_theta": None}
    # Mamba2 fields: kinds.Mamba2Params; experts: ffn_kinds.MoEParams, SharedExpertParams; config.Multipliers
    return HybridConfig.make(
        model_type="granitemoehybrid",
        layer_types=layer_types,
        ffn_types=("shared_moe" if experts > 0 else "shared_mlp",) * len(layer_types),
        intermediate_size=hf.get("intermediate_size", 11008),
        shared_intermediate_size=hf.get("shared_intermediate_size", 1024),
        attention_bias=hf.get("attention_bias", False),
        num_experts=max(experts, 1),
        num_experts_per_tok=hf.get("num_experts_per_tok", 2),
        moe_renormalize=True,
        embedding_multiplier=float(hf.get("embedding_multiplier") or 1.0),
        residual_multiplier=float(hf.get("residual_multiplier") or 1.0),
        attention_multiplier=float(hf.get("attention_multiplier") or 1.0),
        logits_scaling=float(hf.get("logits_scaling") or 1.0),
        **decoder_fields(hf, d, heads, vocab=32000, eps=1e-6, context=2048, head_dim=d // heads),
        **special_tokens(hf, bos=1, eos=2, pad=None),
        **mamba2_fields("granitemoehybrid", hf, d),
        **rope,
    )


FAMILY = register(
    Family(
        model_type="granitemoehybrid",
        translate=translate,
        renames=JAMBA_MIXER
        + LLAMA_NORMS
        + (
            (r"\.shared_mlp\.", ".ffn.shared."),
            # Released files: experts as input_linear/output_linear, router as router.layer.
            (r"\.block_sparse_moe\.input_linear\.weight$", ".ffn.moe.experts.gate_up_proj"),
            (r"\.block_sparse_moe\.output_linear\.weight$", ".ffn.moe.experts.down_proj"),
            (r"\.block_sparse_moe\.router\.layer\.", ".ffn.moe.router."),
            (r"\.block_sparse_moe\.", ".ffn.moe."),
        ),
        ignore=ROTARY_CACHE,
    )
)
