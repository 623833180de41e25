"""Falcon-H1 (`FalconH1ForCausalLM`): every layer runs attention (RoPE, GQA) and a Mamba2 mixer
in parallel on the same normed input and sums them, then a gated MLP; muP multipliers on the
embeddings, both branches' inputs and outputs, the keys, the Mamba2 in_proj parts, the MLP and
the logits (applied in the forward, as transformers does, not folded into weights)."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import JAMBA_LAYOUT, ROTARY_CACHE
from ..loading.registry import Family, register
from ..loading.translate import (
    check_silu,
    check_time_step_limit,
    decoder_fields,
    rope_settings,
    special_tokens,
    unsupported,
)

MODEL = "falcon_h1"


def _multipliers(hf: dict[str, Any], field: str, default: list[float]) -> tuple[float, ...]:
    value = hf.get(field)
    if value is None:
        return tuple(default)
    if not isinstance(value, list | tuple) or len(value) != len(default):
        raise unsupported(MODEL, field, value, f"a list of {len(default)} numbers")
    return tuple(float(v) for v in value)


def _scalar(hf: dict[str, Any], field: str) -> float:
    value = hf.get(field)
    return 1.0 if value is None else float(value)


def translate(hf: dict[str, Any]) -> HybridConfig:
    check_silu(MODEL, hf)
    check_time_step_limit(MODEL, hf)
    n = hf.get("num_hidden_layers", 32)
    d = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim") or d // heads
    d_ssm = hf.get("mamba_d_ssm", 1024)
    if d_ssm is None:
        d_ssm = int(hf.get("mamba_expand", 2) * d)
    m_heads = hf.get("mamba_n_heads", 128)
    m_head_dim = hf.get("mamba_d_head", "auto")
    m_head_dim = d_ssm // m_heads if m_head_dim in ("auto", None) else int(m_head_dim)
    if m_head_dim * m_heads != d_ssm:
        raise unsupported(MODEL, "mamba_d_head", m_head_dim, "mamba_d_ssm / mamba_n_heads")
    groups = hf.get("mamba_n_groups", 1)
    if m_heads % groups or d_ssm % groups:
        raise unsupported(MODEL, "mamba_n_groups", groups, "a divisor of mamba_n_heads")
    key_multiplier = _scalar(hf, "key_multiplier")
    rms_norm = hf.get("mamba_rms_norm", False)
    # kinds.ParallelHybridParams (muP multipliers, Mamba2 variant), Mamba2Params; config.Multipliers
    return HybridConfig.make(
        model_type=MODEL,
        layer_types=("parallel_hybrid",) * n,
        ffn_types=("scaled_mlp",) * n,
        intermediate_size=hf.get("intermediate_size", 14336),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        # the key multiplier scales every score of the head alike
        attention_multiplier=key_multiplier * head_dim**-0.5,
        embedding_multiplier=_scalar(hf, "embedding_multiplier"),
        logits_scaling=1.0 / _scalar(hf, "lm_head_multiplier"),
        attention_in_multiplier=_scalar(hf, "attention_in_multiplier"),
        attention_out_multiplier=_scalar(hf, "attention_out_multiplier"),
        ssm_in_multiplier=_scalar(hf, "ssm_in_multiplier"),
        ssm_out_multiplier=_scalar(hf, "ssm_out_multiplier"),
        ssm_multipliers=_multipliers(hf, "ssm_multipliers", [1.0] * 5),
        mlp_multipliers=_multipliers(hf, "mlp_multipliers", [1.0, 1.0]),
        mamba_d_state=hf.get("mamba_d_state", 256),
        mamba_d_conv=hf.get("mamba_d_conv", 4),
        mamba2_heads=m_heads,
        mamba2_head_dim=m_head_dim,
        mamba2_groups=groups,
        mamba2_conv_bias=bool(hf.get("mamba_conv_bias", True)),
        mamba2_proj_bias=bool(hf.get("mamba_proj_bias", False)),
        mamba2_out_bias=bool(hf.get("projectors_bias", False)),
        mamba2_gated_norm=bool(rms_norm),
        mamba2_norm_before_gate=bool(hf.get("mamba_norm_before_gate", True)),
        **decoder_fields(hf, d, heads, vocab=128000, eps=1e-5, context=8192, head_dim=head_dim),
        **special_tokens(hf, bos=1, eos=2, pad=0),
        **rope_settings(MODEL, hf),
    )


FAMILY = register(
    Family(
        model_type=MODEL,
        translate=translate,
        renames=JAMBA_LAYOUT + ((r"\.(mamba|self_attn)\.", r".mixer.\1."),),  # both mixers, side by side
        ignore=ROTARY_CACHE + (r"mup_vector$",),
    )
)
