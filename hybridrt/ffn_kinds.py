"""Feed-forward kinds as data: the one table that says what each feed-forward kind is.

`ffn_types` holds one entry per layer, each a kind of this table: the module that implements
it (called as `Module(cfg, layer)` then `ffn(x)` with x [b, l, d]; None for a layer without a
feed-forward), the frozen dataclass of the parameters it alone reads (`FfnKind.params`, read as
`cfg.params(MoEParams).num_experts`), and the kinds whose parameters it reads too (`uses`): the
MoE kinds are the `moe` router and experts with more around them, so they use `moe`, and those
with a shared expert use `shared_mlp`. The config keeps one instance per kind in use
(`HybridConfig.ffn_params`), as it does for the layer kinds (kinds.py).

Torch-free: the module is named, not imported.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FfnKind:
    name: str
    module: str | None  # "package.module:Class"; None for a layer without a feed-forward
    # A frozen dataclass of the parameters this kind alone reads (with defaults for all of them).
    params: type | None = None
    # Kinds whose parameters this kind also reads, because it runs their blocks inside its own.
    uses: tuple[str, ...] = ()


@dataclass(frozen=True)
class MoEParams:
    """Kind `moe` and the kinds built on it: E routed experts, k chosen per token, and the
    variants of the families that route differently (sigmoid_moe, gated_shared_moe, nemotron_moe)."""

    num_experts: int = 1
    num_experts_per_tok: int = 1
    moe_renormalize: bool = False  # top-k weights rescaled to sum to 1 (Granite); Jamba keeps them
    moe_intermediate_size: int = (
        0  # each routed expert's size (LFM2-MoE, Qwen3-Next, Nemotron-H); 0 = intermediate_size
    )
    moe_expert_bias: bool = False  # a per-expert bias added to the scores for the top-k choice only (LFM2-MoE)
    moe_routed_scaling: float = 1.0  # the routing weights are multiplied by it (LFM2-MoE, Nemotron-H)


@dataclass(frozen=True)
class SharedExpertParams:
    """Kind `shared_mlp` (Granite's shared expert alone) and the MoE kinds with a shared expert
    beside the routed ones: its intermediate size."""

    shared_intermediate_size: int = 0


@dataclass(frozen=True)
class NemotronMoEParams:
    """Kind `nemotron_moe`: a DeepSeek-V3 style router chooses the top k experts within the
    moe_topk_groups best of moe_groups groups; an optional latent projection of this size
    around the experts (0 = none)."""

    moe_groups: int = 1
    moe_topk_groups: int = 1
    moe_latent_size: int = 0


FFN_KINDS: dict[str, FfnKind] = {}


def register_ffn(name: str, module: str | None, params: type | None = None, uses: tuple[str, ...] = ()) -> FfnKind:
    FFN_KINDS[name] = FfnKind(name, module, params, uses)
    return FFN_KINDS[name]


register_ffn("mlp", "hybridrt.models.layers:MLP")
register_ffn("moe", "hybridrt.models.layers:MoE", params=MoEParams)
register_ffn("shared_mlp", "hybridrt.models.ffn.shared:SharedMLP", params=SharedExpertParams)
register_ffn("shared_moe", "hybridrt.models.ffn.shared:SharedMoE", uses=("moe", "shared_mlp"))
register_ffn("none", None)
register_ffn("scaled_mlp", "hybridrt.models.mixers.parallel_hybrid:ScaledMLP")  # kinds.ParallelHybridParams
# LFM2-MoE: sigmoid router, selection-only expert bias, scaled weights.
register_ffn("sigmoid_moe", "hybridrt.models.ffn.sigmoid_moe:SigmoidMoE", uses=("moe",))
# Qwen3-Next: routed experts beside a gated shared expert.
register_ffn("gated_shared_moe", "hybridrt.models.ffn.gated_moe:GatedSharedMoE", uses=("moe", "shared_mlp"))
# OLMo 2/3: no norm before the MLP, an RMSNorm after it (kinds' post_norm_attention).
register_ffn("post_norm_mlp", "hybridrt.models.mixers.post_norm:PostNormMLP")
# Nemotron-H's MLP layer: down(relu(up(x))^2), no gate.
register_ffn("relu2_mlp", "hybridrt.models.ffn.relu2_mlp:Relu2MLP")
# Nemotron-H's MoE layer: sigmoid group-limited router, squared-ReLU experts, shared expert.
register_ffn(
    "nemotron_moe",
    "hybridrt.models.ffn.relu2_mlp:NemotronMoE",
    params=NemotronMoEParams,
    uses=("moe", "shared_mlp"),
)
