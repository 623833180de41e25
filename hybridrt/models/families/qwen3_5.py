"""Qwen3.5 text model (`Qwen3_5ForCausalLM`, model_type "qwen3_5_text"): Qwen3-Next's Gated
DeltaNet and gated attention layers with separate q/k/v, z, b and a projections, and a dense
SwiGLU MLP on every layer. Its rotary is MRoPE; for text alone the three position streams are
equal, which makes it the ordinary (partial) rotary. RMSNorms are zero-centered (w + 1 at load).

The multimodal checkpoint (model_type "qwen3_5", `Qwen3_5ForConditionalGeneration`) is read
as its language model for text: `text_config`, weights under `model.language_model.`, the
vision tower left out (transformers' AutoModelForCausalLM reads it the same way). Images and
video are not supported: their three-dimensional positions have no place in the graph."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..registry import Family, register
from ..translate import (
    QWEN_GDN_IGNORE,
    QWEN_GDN_RENAMES,
    QWEN_MULTIMODAL_IGNORE,
    QWEN_MULTIMODAL_RENAMES,
    qwen_gdn_fields,
    qwen_text_config,
    qwen_zero_centered,
)


def translate(hf: dict[str, Any], model_type: str = "qwen3_5_text") -> HybridConfig:
    fields = qwen_gdn_fields(model_type, hf)
    n = len(fields["layer_types"])
    return HybridConfig(
        ffn_types=("mlp",) * n,
        intermediate_size=hf.get("intermediate_size", 12288),
        gdn_split_proj=True,
        **fields,
    )


FAMILY = register(
    Family(
        model_type="qwen3_5_text",
        translate=translate,
        renames=((r"^model\.language_model\.", "model."),) + QWEN_GDN_RENAMES,
        ignore=QWEN_GDN_IGNORE,
        convert=qwen_zero_centered,
    )
)


def translate_multimodal(hf: dict[str, Any]) -> HybridConfig:
    return translate(qwen_text_config(hf), "qwen3_5")


MULTIMODAL = register(
    Family(
        model_type="qwen3_5",
        translate=translate_multimodal,
        renames=QWEN_MULTIMODAL_RENAMES,
        ignore=QWEN_MULTIMODAL_IGNORE,
        convert=qwen_zero_centered,
    )
)
