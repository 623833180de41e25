"""Llama (`LlamaForCausalLM`): the attention-only baseline, RoPE, gated MLP."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import LLAMA_RENAMES, ROTARY_CACHE
from ..loading.registry import Family, register
from ..loading.translate import check_silu, decoder_fields, rope_settings, special_tokens


def translate(hf: dict[str, Any]) -> HybridConfig:
    n = hf.get("num_hidden_layers", 32)
    heads = hf.get("num_attention_heads", 32)
    d = hf.get("hidden_size", 4096)
    check_silu("llama", hf)
    return HybridConfig(
        model_type="llama",
        layer_types=("attention",) * n,
        ffn_types=("mlp",) * n,
        intermediate_size=hf.get("intermediate_size", 11008),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        **decoder_fields(hf, d, heads, vocab=32000, eps=1e-6, context=2048),
        **special_tokens(hf, bos=1, eos=2, pad=None),
        **rope_settings("llama", hf),
    )


FAMILY = register(Family(model_type="llama", translate=translate, renames=LLAMA_RENAMES, ignore=ROTARY_CACHE))
