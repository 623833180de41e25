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

from ..loading.registry import register
from ..loading.translate import qwen3_5_families


def ffn_fields(hf: dict[str, Any], n: int) -> dict[str, Any]:
    """A dense SwiGLU MLP on each of the n layers."""
    return {"ffn_types": ("mlp",) * n, "intermediate_size": hf.get("intermediate_size", 12288)}


FAMILY, MULTIMODAL = (register(f) for f in qwen3_5_families("qwen3_5_text", "qwen3_5", ffn_fields))
