"""Qwen3-Next (`Qwen3NextForCausalLM`): Gated DeltaNet layers and gated attention (per-head
q/k RMSNorm, partial rotary, output times sigmoid(gate)); each layer's feed-forward is a
routed MoE beside a gated shared expert, or a dense MLP (`decoder_sparse_step`,
`mlp_only_layers`). RMSNorms are zero-centered: stored w becomes w + 1 at load."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import QWEN_GDN_IGNORE, QWEN_GDN_RENAMES
from ..loading.registry import Family, register
from ..loading.translate import qwen_gdn_fields, qwen_zero_centered


def translate(hf: dict[str, Any]) -> HybridConfig:
    fields = qwen_gdn_fields("qwen3_next", hf)
    n = len(fields["layer_types"])
    experts = hf.get("num_experts", 512) or 0
    step = hf.get("decoder_sparse_step", 1) or 1
    dense = set(hf.get("mlp_only_layers") or [])
    ffn = tuple(
        "gated_shared_moe" if experts > 0 and i not in dense and (i + 1) % step == 0 else "mlp" for i in range(n)
    )
    return HybridConfig.make(  # the experts: ffn_kinds.MoEParams, SharedExpertParams
        ffn_types=ffn,
        intermediate_size=hf.get("intermediate_size", 5632),
        moe_intermediate_size=hf.get("moe_intermediate_size", 512),
        shared_intermediate_size=hf.get("shared_expert_intermediate_size", 512),
        num_experts=max(experts, 1),
        num_experts_per_tok=hf.get("num_experts_per_tok", 10),
        moe_renormalize=bool(hf.get("norm_topk_prob", True)),
        **fields,
    )


FAMILY = register(
    Family(
        model_type="qwen3_next",
        translate=translate,
        renames=QWEN_GDN_RENAMES,
        ignore=QWEN_GDN_IGNORE,
        convert=qwen_zero_centered,
    )
)
