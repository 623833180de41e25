"""Qwen3.5 text model (`Qwen3_5ForCausalLM`, model_type "qwen3_5_text"): Qwen3-Next's Gated
DeltaNet and gated attention layers with separate q/k/v, z, b and a projections, and a dense
SwiGLU MLP on every layer. Its rotary is MRoPE; for text alone the three position streams are
equal, which makes it the ordinary (partial) rotary. RMSNorms are zero-centered (w + 1 at load).

The multimodal checkpoint (model_type "qwen3_5", `Qwen3_5ForConditionalGeneration`, weights
under `model.language_model.`) is not registered: its positions for images and video are
three-dimensional, which the graph's position_ids cannot carry."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..registry import Family, register
from ..translate import QWEN_GDN_IGNORE, QWEN_GDN_RENAMES, qwen_gdn_fields, qwen_zero_centered


def translate(hf: dict[str, Any]) -> HybridConfig:
    fields = qwen_gdn_fields("qwen3_5_text", hf)
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
