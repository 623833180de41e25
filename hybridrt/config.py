"""The model configuration: one frozen dataclass, the single source of defaults. Torch-free,
below graphs/ (whose contract is a function of it) and models/ (which builds from it).

`layer_types` is the hybrid as data: one entry per layer, each a mixer kind of
`kinds.LAYER_KINDS`. It drives the model build, the graph's state inputs (graphs.contract),
the runtime's buffer allocation and the tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .kinds import FFN_KINDS, LAYER_KINDS

MIXER_KINDS = LAYER_KINDS  # the table in kinds.py; names here for older imports
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class HybridConfig:
    """Architecture of a hybrid decoder-only language model.

    Dimension glossary used across `hybridrt.models`:
      b  batch            l  sequence length (this call)     p  past length (KV)
      d  hidden_size      d_inner  mamba expand * d           n  d_state
      h  attention heads  h_kv  key/value heads               hd  head_dim
      k  d_conv           r  dt_rank                           v  vocab_size
      H  mamba2 heads     P  mamba2 head_dim                   G  mamba2 groups (of B, C)
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    ffn_types: tuple[str, ...]
    intermediate_size: int = 0
    num_attention_heads: int = 1
    num_key_value_heads: int = 1
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each query and key head before RoPE (LFM2)
    # Rotary position embedding; rope_theta None means the attention uses no positions
    # (Jamba: the Mamba layers carry position information).
    rope_theta: float | None = None
    rope_type: str = "default"
    rope_scaling: tuple[tuple[str, float], ...] = ()
    rope_partial_factor: float = 1.0  # rotary on the first int(head_dim * factor) dims only (Bamba)
    # Mamba (selective SSM, Gu & Dao 2023)
    mamba_d_state: int = 16
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_dt_rank: int = 0
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_inner_norms: bool = False  # Jamba's RMSNorms on dt, B and C
    mamba_inner_norm_weights: bool = True  # False: Falcon-Mamba's weightless norms
    mamba_inner_norm_eps: float | None = None  # None: rms_norm_eps
    # Mamba2 (SSD, Dao & Gu 2024); d_state and d_conv are shared with Mamba1 above.
    mamba2_heads: int = 0
    mamba2_head_dim: int = 64
    mamba2_groups: int = 1
    mamba2_conv_bias: bool = True
    mamba2_proj_bias: bool = False
    # Mamba2 as Zamba2 and Nemotron-H run it: dt clamped below at `time_step_min` (0 = no
    # clamp) and the gated norm's own eps (None: rms_norm_eps).
    mamba2_dt_min: float = 0.0
    mamba2_norm_eps: float | None = None
    # Short causal conv (LFM2)
    conv_kernel: int = 3
    conv_bias: bool = False
    # Scalar multipliers (Granite); the defaults leave a model unchanged.
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None  # None: 1 / sqrt(head_dim)
    logits_scaling: float = 1.0  # logits are divided by it
    # Shared expert beside the routed ones (Granite MoE); 0 = none.
    shared_intermediate_size: int = 0
    # Mixture of experts
    num_experts: int = 1
    num_experts_per_tok: int = 1
    moe_renormalize: bool = False  # top-k weights rescaled to sum to 1 (Granite); Jamba keeps them
    # Falcon-H1 (kind "parallel_hybrid", FFN "scaled_mlp"): muP multipliers; defaults change nothing.
    attention_in_multiplier: float = 1.0  # on the attention's input
    attention_out_multiplier: float = 1.0  # on the attention's output
    ssm_in_multiplier: float = 1.0  # on the Mamba2 mixer's input
    ssm_out_multiplier: float = 1.0  # on the Mamba2 mixer's output
    ssm_multipliers: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)  # on in_proj's z, x, B, C, dt parts
    mlp_multipliers: tuple[float, ...] = (1.0, 1.0)  # on the gate projection and on the MLP's output
    mamba2_gated_norm: bool = True  # False: y * silu(z) with no RMSNorm (Falcon-H1 mamba_rms_norm false)
    mamba2_norm_before_gate: bool = False  # True: RMSNorm(y) * silu(z) (Falcon-H1 mamba_norm_before_gate)
    mamba2_out_bias: bool = False  # bias of the Mamba2 out_proj (Falcon-H1 projectors_bias)
    # LFM2-MoE (FFN "sigmoid_moe"): sigmoid router, selection-only expert bias, scaled weights.
    moe_intermediate_size: int = 0  # each routed expert's size (also Qwen3-Next); 0 = intermediate_size
    moe_expert_bias: bool = False  # a per-expert bias added to the scores for the top-k choice only
    moe_routed_scaling: float = 1.0  # the routing weights are multiplied by it
    # Gated DeltaNet (Qwen3-Next, Qwen3.5): linear-attention layers with a delta-rule state
    # [b, gdn_v_heads, gdn_k_head_dim, gdn_v_head_dim]; each key head serves v/k value heads.
    gdn_k_heads: int = 0
    gdn_v_heads: int = 0
    gdn_k_head_dim: int = 128
    gdn_v_head_dim: int = 128
    gdn_conv_kernel: int = 4
    gdn_split_proj: bool = False  # Qwen3.5: in_proj_qkv/z/b/a; else Qwen3-Next's interleaved qkvz/ba
    # Gated attention (Qwen3-Next, Qwen3.5): q_proj also yields a per-head gate, y * sigmoid(gate).
    attn_output_gate: bool = False
    # Nemotron-H MoE (ffn kind nemotron_moe): a DeepSeek-V3 style router (sigmoid scores, a
    # score-correction bias for the choice, group-limited top-k, weights scaled by
    # moe_routed_scaling) over squared-ReLU experts of moe_intermediate_size, an optional
    # latent projection around them (0 = none) and a shared expert of shared_intermediate_size.
    moe_groups: int = 1
    moe_topk_groups: int = 1
    moe_latent_size: int = 0
    # Zamba2's shared transformer blocks (kind zamba2_hybrid): how many distinct blocks the
    # hybrid layers use round-robin, the rank of the per-layer LoRA adapters on the shared
    # MLP (and on q/k/v when zamba2_attention_adapter), and the MLP's bias.
    zamba2_mem_blocks: int = 1
    zamba2_adapter_rank: int = 0
    zamba2_attention_adapter: bool = False
    # Special tokens
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # Prompt-path scan: chunk length of the parallel scan (a constant of the graph).
    scan_chunk: int = 16

    def __post_init__(self) -> None:
        if len(self.layer_types) != len(self.ffn_types):
            raise ValueError("layer_types and ffn_types must have one entry per layer")
        for kind in self.layer_types:
            if kind not in LAYER_KINDS:
                raise ValueError(f"unknown mixer kind {kind!r}; known: {', '.join(LAYER_KINDS)}")
        for kind in self.ffn_types:
            if kind not in FFN_KINDS:
                raise ValueError(f"unknown feed-forward kind {kind!r}; known: {', '.join(FFN_KINDS)}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unknown rope type {self.rope_type!r}; known: {', '.join(ROPE_TYPES)}")

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.attn_head_dim * self.rope_partial_factor)

    @property
    def d_inner(self) -> int:
        return self.mamba_expand * self.hidden_size

    @property
    def dt_rank(self) -> int:
        return self.mamba_dt_rank or -(-self.hidden_size // 16)

    @property
    def mamba2_d_inner(self) -> int:
        return self.mamba2_heads * self.mamba2_head_dim

    @property
    def mamba2_conv_dim(self) -> int:
        """Channels of the Mamba2 conv: x, B and C side by side."""
        return self.mamba2_d_inner + 2 * self.mamba2_groups * self.mamba_d_state

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of the Gated DeltaNet conv: q, k and v side by side."""
        return 2 * self.gdn_k_heads * self.gdn_k_head_dim + self.gdn_v_heads * self.gdn_v_head_dim

    @property
    def has_attention(self) -> bool:
        """Whether any layer keeps KV (a kind with `attention`): the graph then takes past_lengths."""
        return any(LAYER_KINDS[k].attention for k in self.layer_types)

    @property
    def uses_positions(self) -> bool:
        """Whether attention rotates queries and keys by position (past_lengths + offset)."""
        return self.rope_theta is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HybridConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        for key in ("layer_types", "ffn_types", "eos_token_id", "ssm_multipliers", "mlp_multipliers"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        if "rope_scaling" in kwargs:
            kwargs["rope_scaling"] = tuple((str(k), float(v)) for k, v in kwargs["rope_scaling"])
        return cls(**kwargs)
