"""Nemotron-H (`NemotronHForCausalLM`): one norm and one op per layer, x + op(norm(x)), the op
chosen by `layers_block_type` (also spelled `layer_types`) or the released
`hybrid_override_pattern` ("M" Mamba2, "*" attention without positions, "-" squared-ReLU MLP,
"E" MoE of squared-ReLU experts). Mamba2 and attention layers are mixers with no
feed-forward; MLP and MoE layers are a feed-forward with no mixer, so the one checkpoint norm
`backbone.layers.{i}.norm` maps to input_norm or ffn_norm by the layer's kind.

The Mamba2 mixer clamps dt to `time_step_limit` (`mamba_dt_limit`), (0, inf) in every released
config, so no clamp: as the mamba_ssm kernels the models were trained with, and transformers
from 5.25 (earlier versions clamped at `time_step_min` in their CPU scan). Its gated norm uses
`layer_norm_epsilon`, like every other norm."""

from __future__ import annotations

import math
import re
from typing import Any

from ...config import HybridConfig
from ..loading.layouts import ROTARY_CACHE
from ..loading.registry import Family, register
from ..loading.translate import SSM_MAX_LENGTH, special_tokens, time_step_floor, unsupported

# layers_block_type entry (or pattern letter) -> (mixer kind, ffn kind)
KINDS = {
    "linear_attention": ("mamba2", "none"),
    "mamba": ("mamba2", "none"),
    "full_attention": ("attention", "none"),
    "attention": ("attention", "none"),
    "mlp": ("none", "relu2_mlp"),
    "moe": ("none", "nemotron_moe"),
}
PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def _blocks(hf: dict[str, Any]) -> tuple[str, list[str]]:
    # transformers reads `layer_types` as `layers_block_type` (attribute_map), and either over
    # the released `hybrid_override_pattern`.
    for field in ("layers_block_type", "layer_types"):
        if hf.get(field) is not None:
            if not isinstance(hf[field], list | tuple):
                raise unsupported("nemotron_h", field, hf[field], "a list of layer kinds")
            return field, list(hf[field])
    pattern = hf.get("hybrid_override_pattern")
    if pattern is None:
        return "layers_block_type", ["linear_attention", "moe", "full_attention", "mlp"]
    for ch in pattern:
        if ch not in PATTERN:
            raise unsupported("nemotron_h", "hybrid_override_pattern", pattern, "M, *, -, E")
    return "hybrid_override_pattern", [PATTERN[ch] for ch in pattern]


def _mamba(hf: dict[str, Any], legacy: str, name: str, default: Any) -> Any:
    """A Mamba2 field under its `mamba_*` spelling or its own name: transformers takes the
    `mamba_*` one when a config has both."""
    return hf[legacy] if legacy in hf else hf.get(name, default)


def translate(hf: dict[str, Any]) -> HybridConfig:
    field, blocks = _blocks(hf)
    for block in blocks:
        if block not in KINDS:
            raise unsupported("nemotron_h", field, hf.get(field), ", ".join(KINDS))
    if hf.get("mamba_hidden_act", "silu") != "silu":
        raise unsupported("nemotron_h", "mamba_hidden_act", hf["mamba_hidden_act"], "silu")
    if hf.get("mlp_hidden_act", "relu2") != "relu2":
        raise unsupported("nemotron_h", "mlp_hidden_act", hf["mlp_hidden_act"], "relu2")
    d = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    mamba_heads, mamba_head_dim = hf.get("mamba_num_heads", 128), hf.get("mamba_head_dim", 64)
    eps = hf.get("layer_norm_epsilon", 1e-5)
    has_attention = any(KINDS[b][0] == "attention" for b in blocks)
    experts, groups = hf.get("n_routed_experts", 8), hf.get("n_group", 1)
    topk_groups = hf.get("topk_group", 1)
    if "moe" in blocks and (experts % groups or (topk_groups < groups and experts // groups < 2)):
        raise unsupported("nemotron_h", "n_group", groups, "a divisor of n_routed_experts, groups of 2 or more")
    # Mamba2 fields: kinds.Mamba2Params; experts: ffn_kinds.MoEParams, SharedExpertParams, NemotronMoEParams
    return HybridConfig.make(
        model_type="nemotron_h",
        vocab_size=hf.get("vocab_size", 131072),
        hidden_size=d,
        layer_types=tuple(KINDS[b][0] for b in blocks),
        ffn_types=tuple(KINDS[b][1] for b in blocks),
        intermediate_size=hf.get("intermediate_size", 21504),
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim", 128),  # transformers: 128 when the config has none
        rms_norm_eps=eps,
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        max_position_embeddings=hf.get("max_position_embeddings", 4096) if has_attention else SSM_MAX_LENGTH,
        attention_bias=False,  # transformers builds the projections without bias whatever the config says
        mlp_bias=hf.get("mlp_bias", False),
        num_experts=experts,
        num_experts_per_tok=hf.get("num_experts_per_tok", 2),
        moe_renormalize=hf.get("norm_topk_prob", True),
        moe_intermediate_size=hf.get("moe_intermediate_size", 7688),
        shared_intermediate_size=hf.get("moe_shared_expert_intermediate_size", 7688),
        moe_groups=groups,
        moe_topk_groups=topk_groups,
        moe_routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
        moe_latent_size=hf.get("moe_latent_size") or 0,
        rope_theta=None,
        mamba_d_state=hf.get("ssm_state_size", 128),
        mamba_d_conv=_mamba(hf, "mamba_d_conv", "conv_kernel", 4),
        mamba2_heads=mamba_heads,
        mamba2_head_dim=mamba_head_dim,
        mamba2_groups=_mamba(hf, "mamba_n_groups", "n_groups", 8),
        mamba2_conv_bias=_mamba(hf, "mamba_conv_bias", "use_conv_bias", True),
        mamba2_proj_bias=hf.get("use_bias", False),
        mamba2_dt_min=time_step_floor("nemotron_h", _mamba(hf, "mamba_dt_limit", "time_step_limit", (0.0, math.inf))),
        mamba2_norm_eps=eps,
        **special_tokens(hf, bos=1, eos=2, pad=0),
    )


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(norm|mixer)\.")


def rename_layer(name: str, cfg: HybridConfig) -> str:
    """The one norm and op of each layer -> input_norm/mixer, or ffn_norm/ffn for MLP layers."""
    m = _LAYER.match(name)
    if m is None:
        return name
    i, part = int(m.group(1)), m.group(2)
    rest = name[m.end() :]
    if cfg.layer_types[i] == "none":
        part = "ffn_norm" if part == "norm" else "ffn"
        if rest.startswith("gate."):  # the MoE router
            rest = "router." + rest[len("gate.") :]
        elif rest.startswith("experts."):  # per-expert tensors, kept apart from the gated-MoE stacking
            rest = "routed_experts." + rest[len("experts.") :]
    elif part == "norm":
        part = "input_norm"
    return f"model.layers.{i}.{part}." + rest


FAMILY = register(
    Family(
        model_type="nemotron_h",
        translate=translate,
        renames=(
            (r"^(backbone|model)\.embeddings\.", "model.embed_tokens."),
            (r"^(backbone|model)\.norm_f\.", "model.norm."),
            (r"^backbone\.", "model."),
        ),
        ignore=ROTARY_CACHE + (r"^mtp\.",),  # the multi-token prediction head
        rename_layer=rename_layer,
    )
)
