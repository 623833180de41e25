"""Tiny random checkpoints of every family (no hub, no network): BUILDERS drives the one
family suite (tests/test_families.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from checkpoints import VOCAB, _randomize, make_jamba, make_llama, make_tokenizer

COMMON = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _save(model: torch.nn.Module, directory: Path) -> Path:
    _randomize(model)
    with torch.no_grad():  # dt biases and decays away from their init, so a wrong mapping shows
        for name, p in model.named_parameters():
            if name.endswith(("dt_bias", "A_log")):
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(directory)
    make_tokenizer(directory)
    return directory


def make_mamba2(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Mamba2: 8 heads of 8 channels in 2 groups, no attention."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=8,
        head_dim=8,
        expand=2,
        n_groups=2,
        state_size=8,
        conv_kernel=4,
        chunk_size=32,
    )
    kwargs.update(overrides)
    return _save(Mamba2ForCausalLM(Mamba2Config(**kwargs)), directory)


def make_granitemoehybrid(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Granite 4.0 H: Mamba2, attention with RoPE, a 4-expert top-2 MoE beside a shared MLP, and
    every multiplier away from 1."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=24,
        shared_intermediate_size=40,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        position_embedding_type="rope",
        embedding_multiplier=1.7,
        residual_multiplier=0.6,
        attention_multiplier=0.3,
        logits_scaling=2.5,
        mamba_n_heads=8,
        mamba_d_head=8,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=32,
        max_position_embeddings=512,
        initializer_range=0.2,  # logits far from zero, so that greedy ties are unlikely
    )
    kwargs.update(overrides)
    return _save(GraniteMoeHybridForCausalLM(GraniteMoeHybridConfig(**kwargs)), directory)


def make_granitemoehybrid_dense(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Granite 4.0 H dense (the shared MLP alone) with no positions in its attention."""
    kwargs: dict[str, object] = {"num_local_experts": 0, "position_embedding_type": None}
    return make_granitemoehybrid(directory, seed, **(kwargs | overrides))


def make_bamba(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Bamba: Mamba2 with attention at layers 1 and 3 (RoPE on half of each head)."""
    from transformers import BambaConfig, BambaForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        attn_layer_indices=[1, 3],
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_n_heads=8,
        mamba_d_head=8,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=32,
        max_position_embeddings=512,
        initializer_range=0.2,
    )
    kwargs.update(overrides)
    return _save(BambaForCausalLM(BambaConfig(**kwargs)), directory)


def make_lfm2(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """LFM2: short-conv layers with attention at layers 1 and 3."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=96,
        block_multiple_of=16,
        num_hidden_layers=4,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        conv_L_cache=3,
        max_position_embeddings=512,
        initializer_range=0.2,
    )
    kwargs.update(overrides)
    return _save(Lfm2ForCausalLM(Lfm2Config(**kwargs)), directory)


def make_mamba(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Mamba1 without attention (the Jamba mixer minus its dt/B/C norms)."""
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(hidden_size=32, num_hidden_layers=2, state_size=8, conv_kernel=4, expand=2)
    kwargs.update(overrides)
    return _save(MambaForCausalLM(MambaConfig(**kwargs)), directory)


def make_falcon_mamba(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Falcon-Mamba: Mamba1 with weightless dt/B/C norms."""
    from transformers import FalconMambaConfig, FalconMambaForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32, num_hidden_layers=2, state_size=8, conv_kernel=4, expand=2, mixer_rms_eps=1e-5
    )
    kwargs.update(overrides)
    return _save(FalconMambaForCausalLM(FalconMambaConfig(**kwargs)), directory)


def make_falcon_h1(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Falcon-H1: attention (RoPE, GQA) beside a Mamba2 mixer in every layer, every muP multiplier
    away from 1, biased projections, and the gated RMSNorm normalizing before the gate."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=48,
        mamba_n_heads=6,
        mamba_d_head=8,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_chunk_size=32,
        mamba_rms_norm=True,
        mamba_norm_before_gate=True,
        mamba_proj_bias=True,
        projectors_bias=True,
        embedding_multiplier=1.7,
        lm_head_multiplier=0.6,
        attention_in_multiplier=0.8,
        attention_out_multiplier=1.3,
        key_multiplier=0.7,
        ssm_in_multiplier=1.2,
        ssm_out_multiplier=0.9,
        ssm_multipliers=[0.8, 1.1, 0.9, 1.2, 0.7],
        mlp_multipliers=[1.1, 0.8],
        max_position_embeddings=512,
        initializer_range=0.2,
    )
    kwargs.update(overrides)
    return _save(FalconH1ForCausalLM(FalconH1Config(**kwargs)), directory)


def make_lfm2_moe(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """LFM2-MoE: short-conv layers with attention at layers 1 and 3, a dense first layer, then a
    6-expert top-2 sigmoid MoE with a (random) selection bias, renormalized and scaled."""
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=24,
        num_hidden_layers=4,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        num_dense_layers=1,
        num_experts=6,
        num_experts_per_tok=2,
        routed_scaling_factor=1.5,
        num_attention_heads=4,
        num_key_value_heads=2,
        conv_L_cache=3,
        max_position_embeddings=512,
        initializer_range=0.2,
    )
    kwargs.update(overrides)
    model = Lfm2MoeForCausalLM(Lfm2MoeConfig(**kwargs))
    with torch.no_grad():  # a selection bias comparable to the sigmoid scores, so it changes choices
        for name, buf in model.named_buffers():
            if name.endswith("expert_bias"):
                buf.copy_(torch.randn_like(buf) * 0.3)
    return _save(model, directory)


def make_nemotron_h(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Nemotron-H: Mamba2, attention without positions, squared-ReLU MLP and MoE layers (8
    experts in 2 groups, top-2 within the best group, scaled weights, a shared expert), one
    norm and one op per layer."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=48,
        layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"],
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        moe_shared_expert_intermediate_size=40,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.5,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=8,
        mamba_head_dim=8,
        n_groups=2,
        ssm_state_size=8,
        conv_kernel=4,
        chunk_size=32,
        layer_norm_epsilon=1e-5,
        max_position_embeddings=512,
        initializer_range=0.2,
    )
    kwargs.update(overrides)
    model = NemotronHForCausalLM(NemotronHConfig(**kwargs))
    with torch.no_grad():  # the choice bias away from zero, so a wrong mapping shows
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.05)
    return _save(model, directory)


def make_zamba2(directory: Path, seed: int = 0, dt_bias: float | None = 1.0, **overrides: object) -> Path:
    """Zamba2: Mamba2 layers and three hybrid layers over two shared transformer blocks (the
    first and third hybrid layers share one), LoRA adapters on q/k/v and the MLP, RoPE.

    dt_bias: its value before the noise `_save` adds, as the other Mamba2 families' tiny
    models have it (transformers' Zamba2 init draws dt in [time_step_min, time_step_max]:
    with random projections, dt then often falls under the time_step_min clamp, and the
    decay gets far more sensitive to int8 weights than any trained model's); None keeps
    that init (tests/test_family_zamba2.py checks the clamp with it)."""
    from transformers import Zamba2Config, Zamba2ForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=5,
        layers_block_type=["mamba", "hybrid", "hybrid", "mamba", "hybrid"],
        num_attention_heads=4,
        num_mem_blocks=2,
        use_shared_attention_adapter=True,
        adapter_rank=4,
        use_mem_rope=True,
        n_mamba_heads=8,
        mamba_ngroups=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        chunk_size=32,
        max_position_embeddings=512,
        initializer_range=0.1,
    )
    kwargs.update(overrides)
    model = Zamba2ForCausalLM(Zamba2Config(**kwargs))
    if dt_bias is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("dt_bias"):
                    p.fill_(dt_bias)
    return _save(model, directory)


def make_qwen3_next(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Qwen3-Next: Gated DeltaNet (2 key heads serving 4 value heads) and gated attention (GQA,
    rotary on a quarter of each head); a 4-expert top-2 MoE with a gated shared expert on every
    layer but layer 2 (`mlp_only_layers`), which has a dense MLP."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=40,
        decoder_sparse_step=1,
        mlp_only_layers=[2],
        max_position_embeddings=512,
        initializer_range=0.1,  # at 0.2 transformers' own chunked and recurrent rules differ by 5e-4
    )
    kwargs.update(overrides)
    return _save(Qwen3NextForCausalLM(Qwen3NextConfig(**kwargs)), directory)


def make_qwen3_5(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Qwen3.5 text: Gated DeltaNet (2 key heads serving 4 value heads, split projections) and
    gated attention (GQA, rotary on a quarter of each head), dense MLPs."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        max_position_embeddings=512,
        initializer_range=0.1,  # as Qwen3-Next's: far from the chunked rule's rounding
    )
    kwargs.update(overrides)
    return _save(Qwen3_5ForCausalLM(Qwen3_5TextConfig(**kwargs)), directory)


def make_qwen3_5_moe(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Qwen3.5 MoE text: Qwen3.5's layers, a 4-expert top-2 MoE with a gated shared expert on each."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=40,
        max_position_embeddings=512,
        initializer_range=0.1,
    )
    kwargs.update(overrides)
    return _save(Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**kwargs)), directory)


# The text model of the multimodal Qwen3.5 checkpoints (MRoPE sections, equal for text) and
# a one-block vision tower that text never uses.
QWEN3_5_VL_TEXT: dict[str, object] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
    },
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=4,
    max_position_embeddings=512,
    initializer_range=0.1,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
QWEN3_5_VL_VISION: dict[str, object] = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=32,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
)


def _qwen3_5_vl(
    directory: Path, seed: int, config: Any, model: Any, text: dict[str, object], overrides: dict[str, object]
) -> Path:
    torch.manual_seed(seed)
    kwargs: dict[str, object] = dict(
        text_config=QWEN3_5_VL_TEXT | text, vision_config=QWEN3_5_VL_VISION, initializer_range=0.1
    )
    kwargs.update(overrides)
    return _save(model(config(**kwargs)), directory)


def make_qwen3_5_vl(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Multimodal Qwen3.5 (model_type "qwen3_5"): the text model of `make_qwen3_5`."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text: dict[str, object] = {"intermediate_size": 48}
    return _qwen3_5_vl(directory, seed, Qwen3_5Config, Qwen3_5ForConditionalGeneration, text, overrides)


def make_qwen3_5_moe_vl(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Multimodal Qwen3.5 MoE (model_type "qwen3_5_moe"): `make_qwen3_5_moe`'s text model."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    text: dict[str, object] = dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40
    )
    return _qwen3_5_vl(directory, seed, Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, text, overrides)


def make_olmo_hybrid(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """OLMo Hybrid: Gated DeltaNet layers (2 heads, split q/k/v/g/a/b projections, beta in
    [0, 2]) and OLMo 3 post-norm attention layers (GQA, q/k norms over all heads, RoPE)."""
    from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

    torch.manual_seed(seed)
    kwargs = COMMON | dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        max_position_embeddings=512,
        initializer_range=0.1,  # as Qwen3-Next's: far from the chunked rule's rounding
    )
    kwargs.update(overrides)
    return _save(OlmoHybridForCausalLM(OlmoHybridConfig(**kwargs)), directory)


BUILDERS = {
    "jamba": make_jamba,
    "llama": make_llama,
    "mamba2": make_mamba2,
    "granitemoehybrid": make_granitemoehybrid,
    "granitemoehybrid_dense": make_granitemoehybrid_dense,
    "bamba": make_bamba,
    "lfm2": make_lfm2,
    "mamba": make_mamba,
    "falcon_mamba": make_falcon_mamba,
    "falcon_h1": make_falcon_h1,
    "lfm2_moe": make_lfm2_moe,
    "qwen3_next": make_qwen3_next,
    "qwen3_5": make_qwen3_5,
    "qwen3_5_moe": make_qwen3_5_moe,
    "qwen3_5_vl": make_qwen3_5_vl,
    "qwen3_5_moe_vl": make_qwen3_5_moe_vl,
    "nemotron_h": make_nemotron_h,
    "zamba2": make_zamba2,
    "olmo_hybrid": make_olmo_hybrid,
}


def widen_weights(directory: Path, std: float = 0.6, seed: int = 1) -> Path:
    """The checkpoint in `directory` with every 2-D weight but the embedding redrawn at
    std/sqrt(fan_in): activations far wider than the builders' small initializers give, as a
    trained model's are, where a graph's numerics lose precision first."""
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(seed)
    for f in sorted(directory.glob("*.safetensors")):
        tensors = load_file(str(f))
        for name, t in tensors.items():
            if t.dim() == 2 and "embed" not in name:
                tensors[name] = (torch.randn(t.shape, generator=g) * std / t.shape[1] ** 0.5).to(t.dtype)
        save_file(tensors, str(f), metadata={"format": "pt"})
    return directory


def make_wide(directory: Path, family: str, seed: int = 0, std: float = 0.6, **overrides: object) -> Path:
    """`family`'s builder with max length 4,096 (room for 2,048-token prompts), then its weights
    widened (widen_weights)."""
    BUILDERS[family](directory, seed=seed, **{"max_position_embeddings": 4096} | overrides)
    return widen_weights(directory, std)


# The Gated DeltaNet families' released configs at their own layer widths (hidden size, heads,
# head dims, convolution, rotary): four layers (three Gated DeltaNet, one attention), the test
# vocabulary, MLPs of 256 and 8 experts of 64, the only cuts (benchmarks/check_long_parity.py --released).
RELEASED_TEXT = {
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
}


def make_released_gated_delta(directory: Path, config: Path, seed: int = 0, every_expert: bool = False) -> Path:
    """A random checkpoint of the released `config` (a config.json of RELEASED_TEXT's families),
    cut as RELEASED_TEXT's comment says. every_expert: each token routed to all 8 experts, so
    that no near-tie of the router's scores can flip a choice between two implementations
    (random routers over long prompts have such ties: a different expert for one token is a
    difference in kind, not the numerics this measures)."""
    import json

    import transformers

    data = json.loads(config.read_text())
    config_class, model_class = RELEASED_TEXT[data["model_type"]]
    text = dict(data.get("text_config", data))
    text.pop("model_type", None)
    cuts: dict[str, Any] = {"num_hidden_layers": 4, "vocab_size": VOCAB, "max_position_embeddings": 4096}
    cuts |= {k: v for k, v in COMMON.items() if k != "vocab_size"}
    if "layer_types" in text:
        cuts["layer_types"] = text["layer_types"][:4]
    if text.get("intermediate_size"):
        cuts["intermediate_size"] = 256
    if text.get("num_experts"):
        cuts |= {"num_experts": 8, "num_experts_per_tok": 8 if every_expert else 2, "moe_intermediate_size": 64}
        cuts |= {"shared_expert_intermediate_size": 64}
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(**text | cuts)
    cfg.torch_dtype = cfg.dtype = torch.float32
    return _save(getattr(transformers, model_class)(cfg).float(), directory)
