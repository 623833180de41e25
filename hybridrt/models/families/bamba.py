"""Bamba (`BambaForCausalLM`): Mamba2 layers with attention at `attn_layer_indices`, RoPE on
half of each head (transformers hardcodes partial_rotary_factor 0.5), gated MLP everywhere."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import JAMBA_LAYOUT, JAMBA_MIXER, ROTARY_CACHE
from ..loading.registry import Family, register
from ..loading.translate import check_silu, decoder_fields, mamba2_fields, rope_settings, special_tokens


def translate(hf: dict[str, Any]) -> HybridConfig:
    check_silu("bamba", hf)
    n = hf.get("num_hidden_layers", 32)
    d = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    attn = set(hf.get("attn_layer_indices") or ())
    rope = rope_settings("bamba", hf, handled=("partial_rotary_factor",))
    partial = (hf.get("rope_parameters") or {}).get("partial_rotary_factor", 0.5)
    return HybridConfig.make(  # the Mamba2 fields: kinds.Mamba2Params
        model_type="bamba",
        layer_types=tuple("attention" if i in attn else "mamba2" for i in range(n)),
        ffn_types=("mlp",) * n,
        intermediate_size=hf.get("intermediate_size", 14336),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        rope_partial_factor=float(partial),
        **decoder_fields(hf, d, heads, vocab=128000, eps=1e-5, context=262144, head_dim=d // heads),
        **special_tokens(hf, bos=1, eos=2, pad=0),
        **mamba2_fields("bamba", hf, d),
        **rope,
    )


FAMILY = register(
    Family(model_type="bamba", translate=translate, renames=JAMBA_LAYOUT + JAMBA_MIXER, ignore=ROTARY_CACHE)
)
