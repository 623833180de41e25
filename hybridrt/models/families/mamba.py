"""Mamba (`MambaForCausalLM`): a stack of Mamba1 mixers (no inner norms, unlike Jamba's),
no attention and no feed-forward. fp32 residuals change nothing in a float32 model."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..registry import Family, eos_ids, register
from .mamba2 import SSM_MAX_LENGTH, check_silu


def translate(hf: dict[str, Any]) -> HybridConfig:
    check_silu("mamba", hf)
    n = hf.get("num_hidden_layers", 32)
    d = hf.get("hidden_size", 768)
    rank = hf.get("time_step_rank", "auto")
    return HybridConfig(
        model_type="mamba",
        vocab_size=hf.get("vocab_size", 50280),
        hidden_size=d,
        layer_types=("mamba",) * n,
        ffn_types=("none",) * n,
        rms_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
        max_position_embeddings=SSM_MAX_LENGTH,
        mamba_d_state=hf.get("state_size", 16),
        mamba_d_conv=hf.get("conv_kernel", 4),
        mamba_expand=hf.get("expand", 2),
        mamba_dt_rank=-(-d // 16) if rank == "auto" else int(rank),
        mamba_conv_bias=hf.get("use_conv_bias", True),
        mamba_proj_bias=hf.get("use_bias", False),
        mamba_inner_norms=False,
        bos_token_id=hf.get("bos_token_id", 0),
        eos_token_id=eos_ids(hf.get("eos_token_id", 0)),
        pad_token_id=hf.get("pad_token_id", 0),
    )


FAMILY = register(
    Family(
        model_type="mamba",
        translate=translate,
        renames=(
            (r"^backbone\.embeddings\.", "model.embed_tokens."),
            (r"^backbone\.norm_f\.", "model.norm."),
            (r"^backbone\.layers\.(\d+)\.norm\.", r"model.layers.\1.input_norm."),
            (r"^backbone\.", "model."),
        ),
    )
)
