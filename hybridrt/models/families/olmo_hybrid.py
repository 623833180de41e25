"""OLMo Hybrid (`OlmoHybridForCausalLM`): Gated DeltaNet layers ("linear_attention", pre-norm,
separate q/k/v/g/a/b projections, beta doubled when `linear_allow_neg_eigval`, output norm
eps 1e-5) and OLMo 3 attention layers ("full_attention": q/k RMSNorm over all heads, RoPE or
none, and post-norms: x + norm(attn(x)), then x + norm(mlp(x))).

Layer kinds: `gated_delta` with split projections (q, k and v projections and convs merged
into in_proj_qkv and conv1d at load) and `post_norm_attention` with the `post_norm_mlp`
feed-forward. Released checkpoints use no positions (`rope_parameters.rope_theta` null); a
config without rope_parameters gets transformers' default RoPE."""

from __future__ import annotations

import re
from typing import Any

from ...config import HybridConfig
from ..loading.layouts import ROTARY_CACHE
from ..loading.registry import Family, Merge, concat, register
from ..loading.translate import check_silu, decoder_fields, rope_settings, special_tokens, unsupported

MODEL = "olmo_hybrid"
KINDS = {"linear_attention": ("gated_delta", "mlp"), "full_attention": ("post_norm_attention", "post_norm_mlp")}


def _layer_types(hf: dict[str, Any]) -> list[str]:
    """transformers' default: full attention every 4th layer, and on the last if none."""
    kinds = hf.get("layer_types")
    if kinds is None:
        n = hf.get("num_hidden_layers", 32)
        kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
        if "full_attention" not in kinds:
            kinds[-1] = "full_attention"
    for kind in kinds:
        if kind not in KINDS:
            raise unsupported(MODEL, "layer_types", kind, ", ".join(KINDS))
    return list(kinds)


def _rope(hf: dict[str, Any]) -> dict[str, Any]:
    """No positions when rope_theta is null (released checkpoints), else RoPE as transformers
    reads it (its default when the config has no rope settings at all)."""
    params = hf.get("rope_parameters")
    theta_null = isinstance(params, dict) and "rope_theta" in params and params["rope_theta"] is None
    if theta_null or (params is None and "rope_theta" in hf and hf["rope_theta"] is None):
        return {"rope_theta": None}
    return rope_settings(MODEL, hf)


def translate(hf: dict[str, Any]) -> HybridConfig:
    check_silu(MODEL, hf)  # the conv activation and the MLPs read hidden_act
    kinds = _layer_types(hf)
    d, heads = hf.get("hidden_size", 3840), hf.get("num_attention_heads", 30)
    k_heads = hf.get("linear_num_key_heads") or heads
    v_heads = hf.get("linear_num_value_heads") or heads
    if v_heads != k_heads:  # transformers' rule takes q, k and v with one head count
        raise unsupported(MODEL, "linear_num_value_heads", v_heads, "linear_num_key_heads")
    k_dim = hf.get("linear_key_head_dim") or int(0.75 * d / k_heads)
    return HybridConfig.make(
        model_type=MODEL,
        layer_types=tuple(KINDS[k][0] for k in kinds),
        ffn_types=tuple(KINDS[k][1] for k in kinds),
        intermediate_size=hf.get("intermediate_size", 11008),
        attention_bias=hf.get("attention_bias", False),
        qk_norm=True,
        gdn_k_heads=k_heads,
        gdn_v_heads=v_heads,
        gdn_k_head_dim=k_dim,
        gdn_v_head_dim=hf.get("linear_value_head_dim") or 2 * k_dim,
        gdn_conv_kernel=hf.get("linear_conv_kernel_dim", 4),
        gdn_split_proj=True,
        gdn_norm_eps=1e-5,  # transformers' OlmoHybridRMSNormGated(eps=1e-5), as FLA's fused norm
        gdn_beta_scale=2.0 if hf.get("linear_allow_neg_eigval", True) else 1.0,
        **decoder_fields(hf, d, heads, vocab=100352, eps=1e-6, context=65536, head_dim=d // heads),
        **special_tokens(hf, bos=None, eos=100257, pad=100277),
        **_rope(hf),
    )


_NORM = re.compile(r"^model\.layers\.(\d+)\.(post_attention_layernorm|post_feedforward_layernorm)\.")


def rename_layer(name: str, cfg: HybridConfig) -> str:
    """`post_attention_layernorm` is the norm before the MLP in a Gated DeltaNet layer and the
    attention's output norm in an attention layer; `post_feedforward_layernorm` the MLP's."""
    m = _NORM.match(name)
    if m is None:
        return name
    i, norm = m.group(1), m.group(2)
    if norm == "post_feedforward_layernorm":
        ours = "ffn.post_norm"
    else:
        ours = "ffn_norm" if cfg.layer_types[int(i)] == "gated_delta" else "mixer.post_norm"
    return f"model.layers.{i}.{ours}." + name[m.end() :]


FAMILY = register(
    Family(
        model_type=MODEL,
        translate=translate,
        renames=(
            # Released files (transformers writes them so too): the Gated DeltaNet layer's norms
            # under OLMo-core's names, one conv per q, k and v.
            (r"\.attention_layer_norm\.", ".input_layernorm."),
            (r"\.feedforward_layer_norm\.", ".post_attention_layernorm."),
            # q, k and v (projections and convs) become parts of in_proj_qkv and conv1d (merged below)
            (r"\.linear_attn\.(q|k|v)_proj\.weight$", r".mixer.in_proj_qkv.\1"),
            (r"\.linear_attn\.(q|k|v)_conv1d\.weight$", r".mixer.conv1d.\1"),
            (r"\.linear_attn\.g_proj\.", ".mixer.in_proj_z."),
            (r"\.linear_attn\.a_proj\.", ".mixer.in_proj_a."),
            (r"\.linear_attn\.b_proj\.", ".mixer.in_proj_b."),
            (r"\.linear_attn\.o_proj\.", ".mixer.out_proj."),
            (r"\.linear_attn\.o_norm\.", ".mixer.norm."),
            (r"\.(linear_attn|self_attn)\.", ".mixer."),
            (r"\.input_layernorm\.", ".input_norm."),
            (r"\.mlp\.", ".ffn."),
        ),
        ignore=ROTARY_CACHE,
        rename_layer=rename_layer,
        merges=tuple(
            Merge(rf"^(.*\.mixer\.{part})\.(q|k|v)$", r"\1.weight", r"\2", concat(("q", "k", "v")))
            for part in ("in_proj_qkv", "conv1d")
        ),
    )
)
