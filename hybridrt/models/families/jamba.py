"""Jamba (`JambaForCausalLM`): Mamba1 with dt/B/C norms, attention every `attn_layer_period`
layers without positions, MoE feed-forward every `expert_layer_period` layers."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import JAMBA_LAYOUT, JAMBA_MIXER
from ..loading.registry import Family, register
from ..loading.translate import JAMBA_MAMBA1_NAMES, check_silu, decoder_fields, mamba1_fields, special_tokens


def translate(hf: dict[str, Any]) -> HybridConfig:
    n = hf.get("num_hidden_layers", 32)
    period, offset = hf.get("attn_layer_period", 8), hf.get("attn_layer_offset", 4)
    e_period, e_offset = hf.get("expert_layer_period", 2), hf.get("expert_layer_offset", 1)
    experts = hf.get("num_experts", hf.get("num_local_experts", 16))
    check_silu("jamba", hf)
    layer_types = tuple("attention" if i % period == offset else "mamba" for i in range(n))
    ffn_types = tuple("moe" if experts > 1 and i % e_period == e_offset else "mlp" for i in range(n))
    d = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    fields = decoder_fields(hf, d, heads, vocab=65536, eps=1e-6, context=262144, head_dim=d // heads)
    fields["num_key_value_heads"] = hf.get("num_key_value_heads") or 8  # transformers' default: 8, not heads
    return HybridConfig.make(  # mamba_inner_norms: kinds.MambaParams; the experts: ffn_kinds.MoEParams
        model_type="jamba",
        layer_types=layer_types,
        ffn_types=ffn_types,
        intermediate_size=hf.get("intermediate_size", 14336),
        rope_theta=None,
        mamba_inner_norms=True,
        num_experts=experts,
        num_experts_per_tok=hf.get("num_experts_per_tok", 2),
        **fields,
        **mamba1_fields(hf, d, JAMBA_MAMBA1_NAMES),
        **special_tokens(hf, bos=1, eos=2, pad=0),
    )


# The Mamba mixer's dt, B and C norms (mamba_inner_norms).
INNER_NORMS = tuple((rf"\.{x}_layernorm\.", f".{x}_norm.") for x in ("dt", "b", "c"))

FAMILY = register(Family(model_type="jamba", translate=translate, renames=JAMBA_LAYOUT + JAMBA_MIXER + INNER_NORMS))
