"""Mamba2 (`Mamba2ForCausalLM`): a stack of Mamba2 mixers with no attention and no
feed-forward; the helpers here also translate the Mamba2 fields of Bamba and Granite."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import MAMBA_RENAMES
from ..loading.registry import Family, register
from ..loading.translate import check_time_step_limit, special_tokens, ssm_stack, unsupported


def translate(hf: dict[str, Any]) -> HybridConfig:
    fields = ssm_stack("mamba2", hf, "mamba2", n=64, d=4096, vocab=32768, tie=False)
    check_time_step_limit("mamba2", hf)
    heads, head_dim = hf.get("num_heads", 128), hf.get("head_dim", 64)
    if fields["hidden_size"] * hf.get("expand", 2) != heads * head_dim:
        raise unsupported("mamba2", "expand", hf.get("expand", 2), "hidden_size * expand = num_heads * head_dim")
    return HybridConfig.make(  # the Mamba2 fields: kinds.Mamba2Params
        mamba_d_state=hf.get("state_size", 128),
        mamba_d_conv=hf.get("conv_kernel", 4),
        mamba2_heads=heads,
        mamba2_head_dim=head_dim,
        mamba2_groups=hf.get("n_groups", 8),
        mamba2_conv_bias=hf.get("use_conv_bias", True),
        mamba2_proj_bias=hf.get("use_bias", False),
        **special_tokens(hf, bos=0, eos=2, pad=1),
        **fields,
    )


FAMILY = register(Family(model_type="mamba2", translate=translate, renames=MAMBA_RENAMES))
