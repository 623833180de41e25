"""Zamba2 (`Zamba2ForCausalLM`): Mamba2 layers and "hybrid" layers, which first run one of
`num_mem_blocks` shared transformer blocks (round-robin) on concat(x, embeddings), with
per-layer LoRA adapters, and add its projected output to x before their own Mamba2
(layer kind zamba2_hybrid, models/mixers/zamba2.py).

The checkpoint stores each shared block once, under the first hybrid layer that uses it
(`model.layers.{i}.shared_transformer.*`), with every layer's adapters inside it
(`...adapter_list.{j}`, j the hybrid layer's rank): the block maps to
`model.shared.blocks.{k}`, adapter j to hybrid layer j's mixer. Mamba2 as Zamba2 runs it:
conv bias always on, dt clamped below at `time_step_min`, gated-norm eps 1e-5."""

from __future__ import annotations

import re
from typing import Any

from ...config import HybridConfig
from ...kinds import Zamba2Params
from ..loading.layouts import ROTARY_CACHE
from ..loading.registry import Family, register
from ..loading.translate import rope_settings, special_tokens, unsupported

KINDS = {"mamba": "mamba2", "linear_attention": "mamba2", "hybrid": "zamba2_hybrid"}
ACTS = ("gelu", "silu", "relu")


def translate(hf: dict[str, Any]) -> HybridConfig:
    d = hf.get("hidden_size", 2560)
    # transformers reads `layer_types` as `layers_block_type` (attribute_map).
    field = "layers_block_type" if hf.get("layers_block_type") is not None else "layer_types"
    blocks = hf.get(field)
    if blocks is None:
        blocks = ["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"]
        blocks += ["mamba"] * 3 + ["hybrid"] + ["mamba"] * 2
    if not isinstance(blocks, list | tuple):
        raise unsupported("zamba2", field, blocks, "a list of layer kinds")
    for block in blocks:
        if block not in KINDS:
            raise unsupported("zamba2", field, blocks, ", ".join(KINDS))
    act = hf.get("hidden_act", "gelu")
    if act not in ACTS:
        raise unsupported("zamba2", "hidden_act", act, ", ".join(ACTS))
    heads = hf.get("num_attention_heads", 32)
    kv_heads = hf.get("num_key_value_heads") or heads
    attention_adapter = bool(hf.get("use_shared_attention_adapter", False))
    if attention_adapter and kv_heads != heads:  # transformers' k/v adapters are 2d wide
        raise unsupported("zamba2", "num_key_value_heads", kv_heads, "num_attention_heads with adapters")
    rank = hf.get("adapter_rank", 128)
    if rank <= 0:
        raise unsupported("zamba2", "adapter_rank", rank, "a positive rank")
    mamba_heads, expand = hf.get("n_mamba_heads", 8), hf.get("mamba_expand", 2)
    max_len = 16384 if hf.get("use_long_context", False) else hf.get("max_position_embeddings", 4096)
    rope = rope_settings("zamba2", hf) if hf.get("use_mem_rope", False) else {"rope_theta": None}
    return HybridConfig.make(  # the shared blocks: kinds.Zamba2Params; the Mamba2 fields: Mamba2Params
        model_type="zamba2",
        vocab_size=hf.get("vocab_size", 32000),
        hidden_size=d,
        layer_types=tuple(KINDS[b] for b in blocks),
        ffn_types=("none",) * len(blocks),
        intermediate_size=hf.get("intermediate_size") or 4 * d,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=2 * d // heads,  # the shared attention reads concat(x, embeddings): 2d wide
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        hidden_act=act,
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
        max_position_embeddings=max_len,
        mlp_bias=hf.get("add_bias_linear", False),
        mamba_d_state=hf.get("mamba_d_state", 64),
        mamba_d_conv=hf.get("mamba_d_conv", 4),
        mamba2_heads=mamba_heads,
        mamba2_head_dim=int(expand * d) // mamba_heads,
        mamba2_groups=hf.get("mamba_ngroups", 1),
        mamba2_conv_bias=True,  # transformers builds the conv with a bias whatever use_conv_bias says
        mamba2_proj_bias=hf.get("add_bias_linear", False),
        mamba2_dt_min=float(hf.get("time_step_min", 0.001)),
        mamba2_norm_eps=1e-5,
        zamba2_mem_blocks=hf.get("num_mem_blocks", 1),
        zamba2_adapter_rank=rank,
        zamba2_attention_adapter=attention_adapter,
        **special_tokens(hf, bos=1, eos=2, pad=0),
        **rope,
    )


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
_ADAPTER = re.compile(
    r"^shared_transformer\.(?:self_attn\.linear_([qkv])_adapter_list|feed_forward\.gate_up_proj_adapter_list)"
    r"\.(\d+)\.(.*)$"
)


def rename_layer(name: str, cfg: HybridConfig) -> str:
    m = _LAYER.match(name)
    if m is None:
        return name
    i, rest = int(m.group(1)), m.group(2)
    hybrids = [j for j, k in enumerate(cfg.layer_types) if k == "zamba2_hybrid"]
    if (a := _ADAPTER.match(rest)) is not None:
        which = f"{a.group(1)}_adapter" if a.group(1) else "gate_up_adapter"
        return f"model.layers.{hybrids[int(a.group(2))]}.mixer.{which}.{a.group(3)}"
    if rest.startswith("shared_transformer."):
        block = hybrids.index(i) % cfg.params(Zamba2Params).zamba2_mem_blocks
        return f"model.shared.blocks.{block}." + rest[len("shared_transformer.") :]
    for old, new in (
        ("mamba.", "mixer."),
        ("input_layernorm.", "input_norm."),
        ("linear.", "mixer.linear."),
        ("mamba_decoder.input_layernorm.", "mixer.norm."),
        ("mamba_decoder.mamba.", "mixer.mamba."),
    ):
        if rest.startswith(old):
            return f"model.layers.{i}.{new}" + rest[len(old) :]
    return name


FAMILY = register(
    Family(
        model_type="zamba2",
        translate=translate,
        renames=((r"^model\.final_layernorm\.", "model.norm."),),
        ignore=ROTARY_CACHE,
        rename_layer=rename_layer,
    )
)
