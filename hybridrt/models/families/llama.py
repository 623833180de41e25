"""Llama (`LlamaForCausalLM`): the attention-only baseline, RoPE, gated MLP."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.registry import Family, register
from ..loading.translate import rope_settings, special_tokens, unsupported


def translate(hf: dict[str, Any]) -> HybridConfig:
    n = hf.get("num_hidden_layers", 32)
    heads = hf.get("num_attention_heads", 32)
    d = hf.get("hidden_size", 4096)
    if hf.get("hidden_act", "silu") != "silu":
        raise unsupported("llama", "hidden_act", hf["hidden_act"], "silu")
    return HybridConfig(
        model_type="llama",
        vocab_size=hf.get("vocab_size", 32000),
        hidden_size=d,
        layer_types=("attention",) * n,
        ffn_types=("mlp",) * n,
        intermediate_size=hf.get("intermediate_size", 11008),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or d // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        **special_tokens(hf, bos=1, eos=2, pad=None),
        **rope_settings("llama", hf),
    )


FAMILY = register(
    Family(
        model_type="llama",
        translate=translate,
        renames=(
            (r"\.self_attn\.", ".mixer."),
            (r"\.mlp\.", ".ffn."),
            (r"\.input_layernorm\.", ".input_norm."),
            (r"\.post_attention_layernorm\.", ".ffn_norm."),
        ),
        ignore=(r"rotary_emb\.inv_freq$",),
    )
)
