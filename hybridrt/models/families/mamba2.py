"""Mamba2 (`Mamba2ForCausalLM`): a stack of Mamba2 mixers with no attention and no
feed-forward; the helpers here also translate the Mamba2 fields of Bamba and Granite."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.registry import Family, register
from ..loading.translate import SSM_MAX_LENGTH, check_silu, check_time_step_limit, special_tokens, unsupported


def translate(hf: dict[str, Any]) -> HybridConfig:
    check_silu("mamba2", hf)
    check_time_step_limit("mamba2", hf)
    n = hf.get("num_hidden_layers", 64)
    d = hf.get("hidden_size", 4096)
    heads, head_dim = hf.get("num_heads", 128), hf.get("head_dim", 64)
    if d * hf.get("expand", 2) != heads * head_dim:
        raise unsupported("mamba2", "expand", hf.get("expand", 2), "hidden_size * expand = num_heads * head_dim")
    return HybridConfig(
        model_type="mamba2",
        vocab_size=hf.get("vocab_size", 32768),
        hidden_size=d,
        layer_types=("mamba2",) * n,
        ffn_types=("none",) * n,
        rms_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=SSM_MAX_LENGTH,
        mamba_d_state=hf.get("state_size", 128),
        mamba_d_conv=hf.get("conv_kernel", 4),
        mamba2_heads=heads,
        mamba2_head_dim=head_dim,
        mamba2_groups=hf.get("n_groups", 8),
        mamba2_conv_bias=hf.get("use_conv_bias", True),
        mamba2_proj_bias=hf.get("use_bias", False),
        **special_tokens(hf, bos=0, eos=2, pad=1),
    )


FAMILY = register(
    Family(
        model_type="mamba2",
        translate=translate,
        renames=(
            (r"^backbone\.embeddings\.", "model.embed_tokens."),
            (r"^backbone\.norm_f\.", "model.norm."),
            (r"^backbone\.layers\.(\d+)\.norm\.", r"model.layers.\1.input_norm."),
            (r"^backbone\.", "model."),
        ),
    )
)
