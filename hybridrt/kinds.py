"""Layer kinds as data: the one table that says what each mixer kind is.

Every kind declares, once, the module that implements it, the states it carries from one
call to the next (name, per-sequence dims as a function of the config, dtype), whether it
reads the attention mask and rotary positions, and which of its nodes quantization keeps
float. The graph contract (graphs.contract), the reference model (models.decoder), the
runtime's buffers (through the contract), quantization's keep-float rules and the tests
all read this table; nothing else lists kinds (the feed-forward kinds are ffn_kinds.py's).

A mixer is `Module(cfg, layer, shared)` called as `mixer(x, ctx, *past) -> (y, *present)`
with x [b, l, d] the normed hidden states, ctx a `models.context.MixerContext` and the
pasts in the order of `states`. A new kind is one entry here, one module, its tests.

A kind's own parameters are a frozen dataclass (`LayerKind.params`, read as
`cfg.params(Mamba2Params).mamba2_heads`). A kind that runs another kind's mixer inside its
layer names that kind in `uses` (parallel_hybrid and zamba2_hybrid use mamba2): the config
then keeps the used kind's parameters whenever a layer of the using kind is present.

Torch-free (the runtime reads the state dims): the module is named, not imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The dims functions take a hybridrt.config.HybridConfig; it is typed Any here because
# config.py reads this table (validating layer_types), and the import graph has no cycles.
HybridConfig = Any

Dim = str | int
CAPACITY = "capacity"  # the KV axis: a fixed-size buffer of this many positions, chosen by the runtime


@dataclass(frozen=True)
class StateDecl:
    """One state tensor of a layer: `past.{i}.{name}` in, `present.{i}.{name}` out.

    `dims` gives the per-sequence dims (after the batch axis) for a config; the string
    CAPACITY marks the KV axis, whose size the runtime picks per buffer (positions a row can hold)."""

    name: str
    dims: Callable[[HybridConfig], tuple[Dim, ...]]
    dtype: str = "float32"


@dataclass(frozen=True)
class LayerKind:
    name: str
    module: str | None  # "package.module:Class"; None for a layer without a mixer
    states: tuple[StateDecl, ...]
    summary: str
    attention: bool = False  # reads ctx.past_lengths (KV write position) and rotary cos/sin
    # (fnmatch pattern under /model/layers.{i}/, why) for nodes that stay float in every mode
    keep_float: tuple[tuple[str, str], ...] = ()
    # False: the layer has no input_norm and the mixer takes the raw residual stream x
    # (it norms inside, as Zamba2's hybrid layer must: it adds to x before its norm).
    prenorm: bool = True
    # A frozen dataclass of the parameters this kind alone reads (with defaults for all of
    # them); the config carries an instance per kind in use, read through cfg.params(cls).
    params: type | None = None
    # Kinds whose parameters this kind also reads, because it runs their mixer inside its own
    # (Falcon-H1's and Zamba2's layers run a Mamba2 mixer): a layer of this kind puts them in use.
    uses: tuple[str, ...] = ()


def _kv(cfg: HybridConfig) -> tuple[Dim, ...]:
    return (cfg.num_key_value_heads, CAPACITY, cfg.attn_head_dim)


KEY = StateDecl("key", _kv)
VALUE = StateDecl("value", _kv)
MAMBA2_CONV = StateDecl("conv", lambda c: (_m2(c).mamba2_conv_dim(c.mamba_d_state), c.mamba_d_conv - 1))
# [heads, d_state, head_dim]: onnxruntime LinearAttention's own layout (no Transpose per step)
MAMBA2_SSM = StateDecl("ssm", lambda c: (_m2(c).mamba2_heads, c.mamba_d_state, _m2(c).mamba2_head_dim))


@dataclass(frozen=True)
class ShortConvParams:
    """Kind `conv` (LFM2's gated short conv): kernel length k and whether the projections
    and the conv have biases."""

    conv_kernel: int = 3
    conv_bias: bool = False


@dataclass(frozen=True)
class GatedDeltaParams:
    """Kind `gated_delta`: key heads Hk, value heads H (each key head serves H / Hk of them),
    key and value head dims K and V, the conv kernel k, and the variants of the families that
    use it."""

    gdn_k_heads: int = 0
    gdn_v_heads: int = 0
    gdn_k_head_dim: int = 128
    gdn_v_head_dim: int = 128
    gdn_conv_kernel: int = 4
    gdn_split_proj: bool = False  # Qwen3.5 and OLMo: in_proj_qkv/z/b/a; else Qwen3-Next's interleaved qkvz/ba
    gdn_norm_eps: float | None = None  # the gated output norm's eps; None: rms_norm_eps (OLMo: 1e-5)
    gdn_beta_scale: float = 1.0  # beta = scale * sigmoid(b); OLMo's allow_neg_eigval doubles it (beta in [0, 2])

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of the Gated DeltaNet conv: q, k and v side by side."""
        return 2 * self.gdn_k_heads * self.gdn_k_head_dim + self.gdn_v_heads * self.gdn_v_head_dim


@dataclass(frozen=True)
class MambaParams:
    """Kind `mamba` (Mamba1, Gu & Dao 2023): d_inner = expand * d channels, the rank r of dt's
    projection, the biases, and the RMSNorms on dt, B and C that Jamba and Falcon-Mamba add.
    d_state and d_conv are the config's own (shared with Mamba2)."""

    mamba_expand: int = 2
    mamba_dt_rank: int = 0  # 0: ceil(d / 16)
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_inner_norms: bool = False  # Jamba's RMSNorms on dt, B and C
    mamba_inner_norm_weights: bool = True  # False: Falcon-Mamba's weightless norms
    mamba_inner_norm_eps: float | None = None  # None: rms_norm_eps

    def d_inner(self, hidden_size: int) -> int:
        return self.mamba_expand * hidden_size

    def dt_rank(self, hidden_size: int) -> int:
        return self.mamba_dt_rank or -(-hidden_size // 16)


@dataclass(frozen=True)
class Mamba2Params:
    """Kind `mamba2` (SSD, Dao & Gu 2024), also read by the kinds that run a Mamba2 mixer inside
    their layer (`LayerKind.uses`): heads H of head_dim P, groups G of B and C, the biases, and
    the variants of Zamba2 and Nemotron-H. d_state and d_conv are the config's own (shared with
    Mamba1)."""

    mamba2_heads: int = 0
    mamba2_head_dim: int = 64
    mamba2_groups: int = 1
    mamba2_conv_bias: bool = True
    mamba2_proj_bias: bool = False
    # Mamba2 as Zamba2 (`time_step_min`) and Nemotron-H (`time_step_limit`) run it: dt clamped
    # below (0 = no clamp) and the gated norm's own eps (None: rms_norm_eps).
    mamba2_dt_min: float = 0.0
    mamba2_norm_eps: float | None = None

    @property
    def mamba2_d_inner(self) -> int:
        return self.mamba2_heads * self.mamba2_head_dim

    def mamba2_conv_dim(self, d_state: int) -> int:
        """Channels of the Mamba2 conv: x, B and C side by side."""
        return self.mamba2_d_inner + 2 * self.mamba2_groups * d_state


@dataclass(frozen=True)
class Zamba2Params:
    """Kind `zamba2_hybrid`: how many distinct shared transformer blocks the hybrid layers use
    round-robin, the rank of the per-layer LoRA adapters on the shared MLP, and whether q, k and
    v get adapters too."""

    zamba2_mem_blocks: int = 1
    zamba2_adapter_rank: int = 0
    zamba2_attention_adapter: bool = False


@dataclass(frozen=True)
class ParallelHybridParams:
    """Kind `parallel_hybrid` (Falcon-H1), with the `scaled_mlp` feed-forward that goes with it:
    muP multipliers, whose defaults change nothing, and its Mamba2 variant."""

    attention_in_multiplier: float = 1.0  # on the attention's input
    attention_out_multiplier: float = 1.0  # on the attention's output
    ssm_in_multiplier: float = 1.0  # on the Mamba2 mixer's input
    ssm_out_multiplier: float = 1.0  # on the Mamba2 mixer's output
    ssm_multipliers: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)  # on in_proj's z, x, B, C, dt parts
    mlp_multipliers: tuple[float, ...] = (1.0, 1.0)  # scaled_mlp: on the gate projection and on the output
    mamba2_gated_norm: bool = True  # False: y * silu(z) with no RMSNorm (mamba_rms_norm false)
    mamba2_norm_before_gate: bool = False  # True: RMSNorm(y) * silu(z) (mamba_norm_before_gate)
    mamba2_out_bias: bool = False  # bias of the Mamba2 out_proj (projectors_bias)


LAYER_KINDS: dict[str, LayerKind] = {}


def register_kind(kind: LayerKind) -> LayerKind:
    LAYER_KINDS[kind.name] = kind
    return kind


def _gdn(cfg: Any) -> GatedDeltaParams:
    return cfg.params(GatedDeltaParams)  # type: ignore[no-any-return]


def _mamba(cfg: Any) -> MambaParams:
    return cfg.params(MambaParams)  # type: ignore[no-any-return]


def _m2(cfg: Any) -> Mamba2Params:
    return cfg.params(Mamba2Params)  # type: ignore[no-any-return]


register_kind(
    LayerKind(
        "attention",
        "hybridrt.models.layers:Attention",
        (KEY, VALUE),
        "grouped-query causal attention, optional RoPE and q/k norms; KV in fixed-capacity buffers "
        "written in place (GroupQueryAttention when fused), regrown by doubling by the runtime",
        attention=True,
    )
)
register_kind(
    LayerKind(
        "mamba",
        "hybridrt.models.mixers.mamba:MambaMixer",
        (
            StateDecl("conv", lambda c: (_mamba(c).d_inner(c.hidden_size), c.mamba_d_conv - 1)),
            StateDecl("ssm", lambda c: (c.mamba_d_state, _mamba(c).d_inner(c.hidden_size))),
        ),
        "Mamba1 selective SSM (per-channel decay) after a depthwise causal conv",
        params=MambaParams,
        keep_float=(
            ("mixer/dt_proj/*", "dt_proj feeds softplus and exp (the decay); it is small (dt_rank x d_inner)"),
        ),
    )
)
register_kind(
    LayerKind(
        "mamba2",
        "hybridrt.models.mixers.mamba2:Mamba2Mixer",
        (MAMBA2_CONV, MAMBA2_SSM),
        "Mamba2 SSD (scalar decay per head); x, B and C share one conv; gated RMSNorm",
        params=Mamba2Params,
    )
)
register_kind(
    LayerKind(
        "conv",
        "hybridrt.models.mixers.shortconv:ShortConv",
        (StateDecl("conv", lambda c: (c.hidden_size, c.params(ShortConvParams).conv_kernel - 1)),),
        "LFM2's gated short causal conv",
        params=ShortConvParams,
    )
)
register_kind(LayerKind("none", None, (), "no mixer: the layer is its feed-forward alone"))
register_kind(
    LayerKind(
        "parallel_hybrid",
        "hybridrt.models.mixers.parallel_hybrid:ParallelHybrid",
        (KEY, VALUE, MAMBA2_CONV, MAMBA2_SSM),
        "Falcon-H1: attention and a Mamba2 mixer side by side on the same input, outputs summed",
        attention=True,
        params=ParallelHybridParams,
        uses=("mamba2",),
    )
)
register_kind(
    LayerKind(
        "gated_delta",
        "hybridrt.models.mixers.gated_delta:GatedDeltaNet",
        (
            StateDecl("conv", lambda c: (_gdn(c).gdn_conv_dim, _gdn(c).gdn_conv_kernel - 1)),
            # [H_v, K, V]: transformers' and onnxruntime LinearAttention's layout
            StateDecl("ssm", lambda c: (_gdn(c).gdn_v_heads, _gdn(c).gdn_k_head_dim, _gdn(c).gdn_v_head_dim)),
        ),
        "Gated DeltaNet (Qwen3-Next, Qwen3.5): delta-rule linear attention with a scalar decay per "
        "head after a depthwise causal conv over q, k and v; gated RMSNorm",
        keep_float=(
            ("mixer/in_proj_ba/*", "in_proj_ba feeds softplus and exp (the decay) and sigmoid (beta); it is small"),
            ("mixer/in_proj_a/*", "in_proj_a feeds softplus and exp (the decay); it is small (d x heads)"),
            ("mixer/in_proj_b/*", "in_proj_b feeds sigmoid (beta, the delta rule's step); it is small"),
        ),
        params=GatedDeltaParams,
    )
)

# Zamba2: a shared transformer block (attention over concat(x, embeddings), 2d wide, then an
# MLP) whose output, projected, is added to x before the layer's Mamba2 norm and mixer.
register_kind(
    LayerKind(
        "zamba2_hybrid",
        "hybridrt.models.mixers.zamba2:Zamba2Hybrid",
        (KEY, VALUE, MAMBA2_CONV, MAMBA2_SSM),
        "Zamba2 hybrid layer: shared attention+MLP block (per-layer LoRA adapters) then Mamba2",
        attention=True,
        params=Zamba2Params,
        uses=("mamba2",),
        prenorm=False,
    )
)
# OLMo 2/3 layers (OLMo Hybrid's attention layers): no norm before the mixer or the MLP, an
# RMSNorm after each, before the residual add; q and k normed over all heads at once.
register_kind(
    LayerKind(
        "post_norm_attention",
        "hybridrt.models.mixers.post_norm:PostNormAttention",
        (KEY, VALUE),
        "OLMo's attention: q/k RMSNorm over all heads, optional RoPE, RMSNorm on the output (post-norm)",
        attention=True,
        prenorm=False,
    )
)


def layer_kind(name: str) -> LayerKind:
    if name not in LAYER_KINDS:
        raise ValueError(f"unknown mixer kind {name!r}; known: {', '.join(LAYER_KINDS)}")
    return LAYER_KINDS[name]
