"""Feed-forward kinds as data: the one table that says what each feed-forward kind is.

`ffn_types` holds one entry per layer, each a kind of this table: the module that implements
it, called as `Module(cfg, layer)` then `ffn(x)` with x [b, l, d] (None for a layer without a
feed-forward). The reference model (models.decoder), the trace cache's keys and the tests read
this table; the layer kinds are kinds.py's.

Torch-free: the module is named, not imported.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FfnKind:
    name: str
    module: str | None  # "package.module:Class"; None for a layer without a feed-forward


FFN_KINDS: dict[str, FfnKind] = {}


def register_ffn(name: str, module: str | None) -> FfnKind:
    FFN_KINDS[name] = FfnKind(name, module)
    return FFN_KINDS[name]


register_ffn("mlp", "hybridrt.models.layers:MLP")
register_ffn("moe", "hybridrt.models.layers:MoE")
register_ffn("shared_mlp", "hybridrt.models.ffn.shared:SharedMLP")
register_ffn("shared_moe", "hybridrt.models.ffn.shared:SharedMoE")
register_ffn("none", None)
register_ffn("scaled_mlp", "hybridrt.models.mixers.parallel_hybrid:ScaledMLP")  # kinds.ParallelHybridParams
# LFM2-MoE: sigmoid router, selection-only expert bias, scaled weights.
register_ffn("sigmoid_moe", "hybridrt.models.ffn.sigmoid_moe:SigmoidMoE")
# Qwen3-Next: routed experts beside a gated shared expert.
register_ffn("gated_shared_moe", "hybridrt.models.ffn.gated_moe:GatedSharedMoE")
# OLMo 2/3: no norm before the MLP, an RMSNorm after it (kinds' post_norm_attention).
register_ffn("post_norm_mlp", "hybridrt.models.mixers.post_norm:PostNormMLP")
# Nemotron-H's MLP layer: down(relu(up(x))^2), no gate.
register_ffn("relu2_mlp", "hybridrt.models.ffn.relu2_mlp:Relu2MLP")
# Nemotron-H's MoE layer: sigmoid group-limited router, squared-ReLU experts, shared expert.
register_ffn("nemotron_moe", "hybridrt.models.ffn.relu2_mlp:NemotronMoE")
