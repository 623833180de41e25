"""Qwen3.5 MoE text model (`Qwen3_5MoeForCausalLM`, model_type "qwen3_5_moe_text"): Qwen3.5's
Gated DeltaNet (split projections) and gated attention layers, each followed by Qwen3-Next's
sparse MoE block (top-k softmax router, always renormalized, beside a gated shared expert).
RMSNorms are zero-centered (w + 1 at load). The multimodal checkpoint ("qwen3_5_moe",
`Qwen3_5MoeForConditionalGeneration`) is read as its language model for text, as Qwen3.5's is."""

from __future__ import annotations

from typing import Any

from ..loading.registry import register
from ..loading.translate import qwen3_5_families


def ffn_fields(hf: dict[str, Any], n: int) -> dict[str, Any]:
    """The sparse MoE block beside a gated shared expert on each of the n layers."""
    return {
        "ffn_types": ("gated_shared_moe",) * n,
        "moe_intermediate_size": hf.get("moe_intermediate_size", 512),
        "shared_intermediate_size": hf.get("shared_expert_intermediate_size", 512),
        "num_experts": hf.get("num_experts", 512),
        "num_experts_per_tok": hf.get("num_experts_per_tok", 10),
        "moe_renormalize": True,
    }


FAMILY, MULTIMODAL = (register(f) for f in qwen3_5_families("qwen3_5_moe_text", "qwen3_5_moe", ffn_fields))
