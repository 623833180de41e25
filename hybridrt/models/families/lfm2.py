"""LFM2 (`Lfm2ForCausalLM`): short gated-conv layers and attention with per-head q/k
RMSNorm and RoPE, SwiGLU feed-forward everywhere; the final norm is `embedding_norm`."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..registry import Family, register
from ..translate import eos_ids, rope_settings, unsupported

LAYER_KINDS = {"conv": "conv", "full_attention": "attention"}


def ffn_size(hf: dict[str, Any]) -> int:
    """transformers' `Lfm2MLP` sizing: 2/3 of intermediate_size, scaled, rounded up."""
    size = hf.get("intermediate_size", hf.get("block_ff_dim", 12288))
    if hf.get("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            size = int(multiplier * size)
            multiple = hf.get("block_multiple_of", 256)
            size = multiple * ((size + multiple - 1) // multiple)
    return int(size)


def translate(hf: dict[str, Any]) -> HybridConfig:
    n = hf.get("num_hidden_layers", 32)
    kinds = hf.get("layer_types")
    if kinds is None:
        attn = set(hf.get("full_attn_idxs") or range(n))
        kinds = ["full_attention" if i in attn else "conv" for i in range(n)]
    for kind in kinds:
        if kind not in LAYER_KINDS:
            raise unsupported("lfm2", "layer_types", kind, ", ".join(LAYER_KINDS))
    d, heads = hf.get("hidden_size", 2560), hf.get("num_attention_heads", 32)
    return HybridConfig(
        model_type="lfm2",
        vocab_size=hf.get("vocab_size", 65536),
        hidden_size=d,
        layer_types=tuple(LAYER_KINDS[k] for k in kinds),
        ffn_types=("mlp",) * len(kinds),
        intermediate_size=ffn_size(hf),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=d // heads,
        rms_norm_eps=hf.get("norm_eps", 1e-5),
        tie_word_embeddings=hf.get("tie_word_embeddings", hf.get("tie_embedding", True)),
        max_position_embeddings=hf.get("max_position_embeddings", 128000),
        qk_norm=True,
        conv_kernel=hf.get("conv_L_cache", 3),
        conv_bias=hf.get("conv_bias", False),
        bos_token_id=hf.get("bos_token_id", 1),
        eos_token_id=eos_ids(hf.get("eos_token_id", 2)),
        pad_token_id=hf.get("pad_token_id", 0),
        **rope_settings("lfm2", hf, default_theta=1000000.0),
    )


FAMILY = register(
    Family(
        model_type="lfm2",
        translate=translate,
        renames=(
            (r"^model\.embedding_norm\.", "model.norm."),
            (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
            (r"\.self_attn\.q_layernorm\.", ".self_attn.q_norm."),
            (r"\.self_attn\.k_layernorm\.", ".self_attn.k_norm."),
            (r"\.self_attn\.", ".mixer."),
            (r"^model\.layers\.(\d+)\.conv\.", r"model.layers.\1.mixer."),
            (r"\.operator_norm\.", ".input_norm."),
            (r"\.feed_forward\.w1\.", ".ffn.gate_proj."),
            (r"\.feed_forward\.w3\.", ".ffn.up_proj."),
            (r"\.feed_forward\.w2\.", ".ffn.down_proj."),
        ),
        ignore=(r"rotary_emb\.inv_freq$",),
    )
)
