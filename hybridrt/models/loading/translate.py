"""Helpers shared by the family translators (hybridrt.models.families.*): no family imports
another, so what two families share lives here (their checkpoint layouts in `layouts`).
Torch-free.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from ...config import HybridConfig
from ...errors import UnsupportedArchitectureError
from .layouts import QWEN_GDN_IGNORE, QWEN_MULTIMODAL_IGNORE, QWEN_MULTIMODAL_RENAMES
from .registry import Family


def unsupported(model_type: str, field: str, value: Any, supported: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{model_type}: config field {field!r} = {value!r} is not supported by hybridrt (supported: {supported})"
    )


def eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list | tuple) else (int(value),)


def special_tokens(hf: dict[str, Any], bos: int | None, eos: int | None, pad: int | None) -> dict[str, Any]:
    """The bos, eos (a tuple of ids) and pad token fields, with these defaults."""
    return {
        "bos_token_id": hf.get("bos_token_id", bos),
        "eos_token_id": eos_ids(hf.get("eos_token_id", eos)),
        "pad_token_id": hf.get("pad_token_id", pad),
    }


def rope_settings(
    model_type: str, hf: dict[str, Any], default_theta: float = 10000.0, handled: tuple[str, ...] = ()
) -> dict[str, Any]:
    """rope_theta, rope_type and scaling from `rope_parameters` (transformers 5) or
    `rope_theta` + `rope_scaling` (transformers 4)."""
    params = hf.get("rope_parameters")
    field = "rope_parameters"
    if params is None:
        params = dict(hf.get("rope_scaling") or {})
        field = "rope_scaling"
        params.setdefault("rope_theta", hf.get("rope_theta", default_theta))
    params = dict(params)
    rope_type = params.pop("rope_type", params.pop("type", "default")) or "default"
    theta = float(params.pop("rope_theta", hf.get("rope_theta", default_theta)))
    needed = {
        "default": (),
        "linear": ("factor",),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    }
    if rope_type not in needed:
        raise unsupported(model_type, f"{field}.rope_type", rope_type, ", ".join(needed))
    scaling = tuple((k, float(params[k])) for k in needed[rope_type] if k in params)
    # Keys the family reads itself (`handled`) or that change nothing are fine; any other key
    # would change the positions, so it is refused rather than ignored.
    extra = [
        k
        for k in params
        if k not in needed[rope_type]
        and k not in handled
        and not (k == "partial_rotary_factor" and float(params[k]) == 1.0)
    ]
    if extra:
        raise unsupported(model_type, f"{field}.{extra[0]}", params[extra[0]], "none for this family")
    missing = [k for k in needed[rope_type] if k not in params]
    if missing:
        raise UnsupportedArchitectureError(f"{model_type}: {field} of type {rope_type!r} lacks {missing}")
    return {"rope_theta": theta, "rope_type": rope_type, "rope_scaling": scaling}


# A pure-SSM model has no positions to run out of; this only bounds the runtime's mask buffer.
SSM_MAX_LENGTH = 65536


def as_float(value: Any) -> float:
    """A float as transformers writes it to JSON: a number, or {"__float__": "Infinity"}."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


def time_step_floor(model_type: str, limit: Any, floor: bool = True) -> float:
    """dt's lower clamp from a `time_step_limit` (the Mamba2 mixer clamps below only): an upper
    bound other than inf is refused, and a lower one too for a family that runs no clamp
    (`floor=False`)."""
    low, high = (as_float(v) for v in limit)
    if high != math.inf or (low > 0.0 and not floor):
        raise unsupported(model_type, "time_step_limit", list(limit), "(low, inf)" if floor else "(0.0, inf)")
    return low


def check_time_step_limit(model_type: str, hf: dict[str, Any]) -> None:
    """transformers clamps dt to `time_step_limit` in its chunked scan only (not in the
    one-token step); with the default (0, inf) the clamp is a no-op everywhere."""
    time_step_floor(model_type, hf.get("time_step_limit", (0.0, math.inf)), floor=False)


def check_silu(model_type: str, hf: dict[str, Any]) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise unsupported(model_type, "hidden_act", hf["hidden_act"], "silu")


def decoder_fields(
    hf: dict[str, Any], d: int, heads: int, *, vocab: int, eps: float, context: int, head_dim: int | None = None
) -> dict[str, Any]:
    """The vocabulary, width, attention head, norm, embedding and context fields under the
    names transformers' decoder configs share, with the family's defaults. `head_dim`: the
    family's own rule; None reads the config's `head_dim`, else d // heads."""
    return {
        "vocab_size": hf.get("vocab_size", vocab),
        "hidden_size": d,
        "num_attention_heads": heads,
        "num_key_value_heads": hf.get("num_key_value_heads") or heads,
        "head_dim": (hf.get("head_dim") or d // heads) if head_dim is None else head_dim,
        "rms_norm_eps": hf.get("rms_norm_eps", eps),
        "tie_word_embeddings": hf.get("tie_word_embeddings", False),
        "max_position_embeddings": hf.get("max_position_embeddings", context),
    }


def ssm_stack(
    model_type: str, hf: dict[str, Any], kind: str, *, n: int, d: int, vocab: int, tie: bool
) -> dict[str, Any]:
    """The fields of a stack of `kind` mixers with no feed-forward (Mamba's and Mamba2's
    configs), `n`, `d`, `vocab` and `tie` the defaults of its layer count, width, vocabulary and
    tied embeddings."""
    check_silu(model_type, hf)
    layers = hf.get("num_hidden_layers", n)
    return {
        "model_type": model_type,
        "vocab_size": hf.get("vocab_size", vocab),
        "hidden_size": hf.get("hidden_size", d),
        "layer_types": (kind,) * layers,
        "ffn_types": ("none",) * layers,
        "rms_norm_eps": hf.get("layer_norm_epsilon", 1e-5),
        "tie_word_embeddings": hf.get("tie_word_embeddings", tie),
        "max_position_embeddings": SSM_MAX_LENGTH,
    }


# Mamba1's fields as MambaConfig names them and as Jamba's config does (with the same defaults).
MAMBA1_NAMES = ("state_size", "conv_kernel", "expand", "time_step_rank", "use_conv_bias", "use_bias")
JAMBA_MAMBA1_NAMES = (
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_dt_rank",
    "mamba_conv_bias",
    "mamba_proj_bias",
)


def mamba1_fields(hf: dict[str, Any], d: int, names: tuple[str, ...] = MAMBA1_NAMES) -> dict[str, Any]:
    """The Mamba1 mixer's fields, read under `names` (MAMBA1_NAMES' order); dt_rank "auto" is
    ceil(d / 16)."""
    state, conv, expand, rank, conv_bias, proj_bias = names
    dt_rank = hf.get(rank, "auto")
    return {
        "mamba_d_state": hf.get(state, 16),
        "mamba_d_conv": hf.get(conv, 4),
        "mamba_expand": hf.get(expand, 2),
        "mamba_dt_rank": -(-d // 16) if dt_rank == "auto" else int(dt_rank),
        "mamba_conv_bias": hf.get(conv_bias, True),
        "mamba_proj_bias": hf.get(proj_bias, False),
    }


# Released files spell the layer kinds "mamba"/"attention" (`layers_block_type`); newer
# transformers write "linear_attention"/"full_attention" (`layer_types`).
LAYER_KINDS = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "attention", "full_attention": "attention"}


def layer_kinds(model_type: str, hf: dict[str, Any], default: str) -> tuple[str, ...]:
    field = "layer_types" if hf.get("layer_types") is not None else "layers_block_type"
    kinds = hf.get(field) or [default] * hf.get("num_hidden_layers", 32)
    for kind in kinds:
        if kind not in LAYER_KINDS:
            raise unsupported(model_type, field, kind, ", ".join(LAYER_KINDS))
    return tuple(LAYER_KINDS[k] for k in kinds)


def mamba2_fields(model_type: str, hf: dict[str, Any], d: int) -> dict[str, Any]:
    """The `mamba_*` fields that Granite and Bamba share."""
    check_time_step_limit(model_type, hf)
    heads, expand = hf.get("mamba_n_heads", 128), hf.get("mamba_expand", 2)
    head_dim = hf.get("mamba_d_head", "auto")
    head_dim = expand * d // heads if head_dim == "auto" else int(head_dim)
    if head_dim * heads != expand * d:
        raise unsupported(model_type, "mamba_d_head", head_dim, "mamba_expand * hidden_size / mamba_n_heads")
    return {
        "mamba_d_state": hf.get("mamba_d_state", 256),
        "mamba_d_conv": hf.get("mamba_d_conv", 4),
        "mamba2_heads": heads,
        "mamba2_head_dim": head_dim,
        "mamba2_groups": hf.get("mamba_n_groups", 1),
        "mamba2_conv_bias": hf.get("mamba_conv_bias", True),
        "mamba2_proj_bias": hf.get("mamba_proj_bias", False),
    }


def mamba_model(model_type: str, hf: dict[str, Any], **changes: Any) -> HybridConfig:
    """A stack of Mamba1 mixers (`MambaForCausalLM` and the families that share its config)."""
    fields = ssm_stack(model_type, hf, "mamba", n=32, d=768, vocab=50280, tie=True)
    fields |= mamba1_fields(hf, fields["hidden_size"])
    fields |= special_tokens(hf, bos=0, eos=0, pad=0)
    return HybridConfig.make(**(fields | {"mamba_inner_norms": False} | changes))  # kinds.MambaParams


# Qwen3-Next and Qwen3.5: Gated DeltaNet ("linear_attention") and gated attention
# ("full_attention") layers, zero-centered RMSNorms (weight stored as w - 1).
QWEN_GDN_KINDS = {"linear_attention": "gated_delta", "full_attention": "attention"}


def qwen_gdn_fields(model_type: str, hf: dict[str, Any]) -> dict[str, Any]:
    """The HybridConfig fields Qwen3-Next and Qwen3.5 share (all but the feed-forwards)."""
    check_silu(model_type, hf)  # the conv activation and the MLPs read hidden_act
    n = hf.get("num_hidden_layers", 48)
    kinds = hf.get("layer_types")
    if kinds is None:
        interval = hf.get("full_attention_interval", 4)
        kinds = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    for kind in kinds:
        if kind not in QWEN_GDN_KINDS:
            raise unsupported(model_type, "layer_types", kind, ", ".join(QWEN_GDN_KINDS))
    k_heads, v_heads = hf.get("linear_num_key_heads", 16), hf.get("linear_num_value_heads", 32)
    if v_heads % k_heads:
        raise unsupported(model_type, "linear_num_value_heads", v_heads, "a multiple of linear_num_key_heads")
    d, heads = hf.get("hidden_size", 2048), hf.get("num_attention_heads", 16)
    params = hf.get("rope_parameters") or {}
    partial = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))
    rope = rope_settings(model_type, hf, handled=("partial_rotary_factor", "mrope_section", "mrope_interleaved"))
    return dict(
        model_type=model_type,
        layer_types=tuple(QWEN_GDN_KINDS[k] for k in kinds),
        attention_bias=hf.get("attention_bias", False),
        qk_norm=True,
        attn_output_gate=True,
        rope_partial_factor=partial,
        gdn_k_heads=k_heads,
        gdn_v_heads=v_heads,
        gdn_k_head_dim=hf.get("linear_key_head_dim", 128),
        gdn_v_head_dim=hf.get("linear_value_head_dim", 128),
        gdn_conv_kernel=hf.get("linear_conv_kernel_dim", 4),
        **decoder_fields(hf, d, heads, vocab=151936, eps=1e-6, context=32768),
        **special_tokens(hf, bos=None, eos=None, pad=None),
        **rope,
    )


def qwen_zero_centered(name: str, tensor: Any, cfg: HybridConfig) -> Any:
    """Qwen3-Next's RMSNorms compute norm(x) * (1 + w): stored w becomes w + 1 (the gated norm
    inside the Gated DeltaNet mixer is an ordinary one)."""
    if re.search(r"(\.(input_norm|ffn_norm|q_norm|k_norm)|^model\.norm)\.weight$", name):
        return tensor.float() + 1.0  # in float32, as transformers computes 1 + w
    return tensor


def qwen_text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a multimodal Qwen3.5 checkpoint (`text_config`), with the
    top-level settings that apply to it (tied embeddings, special tokens when the text config
    lacks them)."""
    text = dict(hf.get("text_config") or {})
    if "tie_word_embeddings" in hf:
        text["tie_word_embeddings"] = hf["tie_word_embeddings"]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if text.get(key) is None and hf.get(key) is not None:
            text[key] = hf[key]
    return text


LFM2_LAYER_KINDS = {"conv": "conv", "full_attention": "attention"}


def lfm2_fields(model_type: str, hf: dict[str, Any], heads: int) -> dict[str, Any]:
    """The attention, conv, norm and token fields LFM2 and LFM2-MoE share."""
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": hf.get("num_key_value_heads") or heads,
        "rms_norm_eps": hf.get("norm_eps", 1e-5),
        # the released spelling `tie_embedding` wins when a file has both, as in transformers
        "tie_word_embeddings": hf["tie_embedding"] if "tie_embedding" in hf else hf.get("tie_word_embeddings", True),
        "max_position_embeddings": hf.get("max_position_embeddings", 128000),
        "qk_norm": True,
        "conv_kernel": hf.get("conv_L_cache", 3),
        "conv_bias": hf.get("conv_bias", False),
        **special_tokens(hf, bos=1, eos=2, pad=0),
        **rope_settings(model_type, hf, default_theta=1000000.0),
    }


def qwen3_5_families(
    text_type: str, multimodal_type: str, ffn: Callable[[dict[str, Any], int], dict[str, Any]]
) -> tuple[Family, Family]:
    """A Qwen3.5 text checkpoint and its multimodal one, read as its language model (the
    `text_config`, weights under `model.language_model.`, the vision tower left out).
    `ffn(hf, n)`: the feed-forward fields of n layers."""

    def translate(hf: dict[str, Any], model_type: str) -> HybridConfig:
        fields = qwen_gdn_fields(model_type, hf)
        return HybridConfig.make(gdn_split_proj=True, **ffn(hf, len(fields["layer_types"])), **fields)

    common: dict[str, Any] = {"convert": qwen_zero_centered}
    text = Family(text_type, lambda hf: translate(hf, text_type), QWEN_MULTIMODAL_RENAMES, QWEN_GDN_IGNORE, **common)
    multimodal = Family(
        multimodal_type,
        lambda hf: translate(qwen_text_config(hf), multimodal_type),
        QWEN_MULTIMODAL_RENAMES,
        QWEN_MULTIMODAL_IGNORE,
        **common,
    )
    return text, multimodal
