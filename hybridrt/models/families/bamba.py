"""Bamba (`BambaForCausalLM`): Mamba2 layers with attention at `attn_layer_indices`, RoPE on
half of each head (transformers hardcodes partial_rotary_factor 0.5), gated MLP everywhere."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.registry import Family, register
from ..loading.translate import check_silu, mamba2_fields, rope_settings, special_tokens


def translate(hf: dict[str, Any]) -> HybridConfig:
    check_silu("bamba", hf)
    n = hf.get("num_hidden_layers", 32)
    d = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    attn = set(hf.get("attn_layer_indices") or ())
    rope = rope_settings("bamba", hf, handled=("partial_rotary_factor",))
    partial = (hf.get("rope_parameters") or {}).get("partial_rotary_factor", 0.5)
    return HybridConfig(
        model_type="bamba",
        vocab_size=hf.get("vocab_size", 128000),
        hidden_size=d,
        layer_types=tuple("attention" if i in attn else "mamba2" for i in range(n)),
        ffn_types=("mlp",) * n,
        intermediate_size=hf.get("intermediate_size", 14336),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=d // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=hf.get("max_position_embeddings", 262144),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        rope_partial_factor=float(partial),
        **special_tokens(hf, bos=1, eos=2, pad=0),
        **mamba2_fields("bamba", hf, d),
        **rope,
    )


FAMILY = register(
    Family(
        model_type="bamba",
        translate=translate,
        renames=(
            (r"^model\.final_layernorm\.", "model.norm."),
            (r"\.(mamba|self_attn)\.", ".mixer."),
            (r"\.feed_forward\.", ".ffn."),
            (r"\.input_layernorm\.", ".input_norm."),
            (r"\.pre_ff_layernorm\.", ".ffn_norm."),
        ),
        ignore=(r"rotary_emb\.inv_freq$",),
    )
)
