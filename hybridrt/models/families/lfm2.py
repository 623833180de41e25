"""LFM2 (`Lfm2ForCausalLM`): short gated-conv layers and attention with per-head q/k
RMSNorm and RoPE, SwiGLU feed-forward everywhere; the final norm is `embedding_norm`."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import LFM2_RENAMES, ROTARY_CACHE
from ..loading.registry import Family, register
from ..loading.translate import LFM2_LAYER_KINDS, lfm2_fields, unsupported


def ffn_size(hf: dict[str, Any]) -> int:
    """transformers' `Lfm2MLP` sizing: 2/3 of intermediate_size, scaled, rounded up. The released
    files' `block_ff_dim` is read as intermediate_size, over it when a file has both (as
    transformers reads it)."""
    size = hf["block_ff_dim"] if "block_ff_dim" in hf else hf.get("intermediate_size", 12288)
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
    if kinds is None:  # older files list the attention layers; with no list, every layer is one
        idxs = hf.get("full_attn_idxs")
        attn = set(range(n) if idxs is None else idxs)
        kinds = ["full_attention" if i in attn else "conv" for i in range(n)]
    for kind in kinds:
        if kind not in LFM2_LAYER_KINDS:
            raise unsupported("lfm2", "layer_types", kind, ", ".join(LFM2_LAYER_KINDS))
    d, heads = hf.get("hidden_size", 2560), hf.get("num_attention_heads", 32)
    return HybridConfig.make(
        model_type="lfm2",
        vocab_size=hf.get("vocab_size", 65536),
        hidden_size=d,
        layer_types=tuple(LFM2_LAYER_KINDS[k] for k in kinds),
        ffn_types=("mlp",) * len(kinds),
        intermediate_size=ffn_size(hf),
        head_dim=d // heads,
        **lfm2_fields("lfm2", hf, heads),
    )


FAMILY = register(
    Family(
        model_type="lfm2",
        translate=translate,
        renames=LFM2_RENAMES,
        ignore=ROTARY_CACHE,
    )
)
