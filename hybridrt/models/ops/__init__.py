"""Fused-kernel seams: torch custom ops whose PyTorch body is the reference computation and
whose ONNX translation is an onnxruntime `com.microsoft` operator.

One module per op holds all of it: the reference, the custom op and its fake and the function
a mixer calls with its `fused` (registry.fusable makes both), the onnxscript translation, and where onnxruntime
needs them the shape rule of its node and the expansion of its placeholder. Each registers
itself (registry.register); export reads the registry (onnx_translations, shape_rules,
expand_placeholders).

- selective_scan: Mamba1's scan, an onnxruntime Scan over the tokens;
- ssd_scan: Mamba2's scan, one LinearAttention node;
- gated_delta: Gated DeltaNet's delta rule, one LinearAttention node;
- causal_conv: a depthwise causal conv with state, one CausalConvWithState node;
- kv_attention (and attend, its mixer-facing form): attention over KV buffers, one
  GroupQueryAttention node;
- moe: a softmax-routed top-k mixture of SiLU-gated experts, one MoE node (the chosen
  experts only).
"""

from __future__ import annotations

from .causal_conv import causal_conv
from .gated_delta import gated_delta
from .kv_attention import (
    GQA_HEAD_MULTIPLE,
    GQA_ROTARY_MULTIPLE,
    apply_rope,
    attend,
    attention_lengths,
    grouped_attention,
    kv_attention,
    rotate_half,
)
from .moe import interleave_experts, moe
from .registry import (
    FUSED_OPS,
    SCAN_DOMAIN,
    FusedOp,
    UsesFusedOps,
    expand_placeholders,
    fused_ops,
    onnx_translations,
    set_fused,
    shape_rules,
)
from .selective_scan import selective_scan
from .ssd_scan import ssd_scan

__all__ = [
    "FUSED_OPS",
    "GQA_HEAD_MULTIPLE",
    "GQA_ROTARY_MULTIPLE",
    "SCAN_DOMAIN",
    "FusedOp",
    "UsesFusedOps",
    "apply_rope",
    "attend",
    "attention_lengths",
    "causal_conv",
    "expand_placeholders",
    "fused_ops",
    "gated_delta",
    "grouped_attention",
    "interleave_experts",
    "kv_attention",
    "moe",
    "onnx_translations",
    "rotate_half",
    "selective_scan",
    "set_fused",
    "shape_rules",
    "ssd_scan",
]
