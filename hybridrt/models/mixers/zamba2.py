"""Zamba2's hybrid layer: a shared transformer block, then the layer's own Mamba2.

The shared block (one of `zamba2_mem_blocks`, used round-robin by the hybrid layers) reads
concat(x, embeddings), 2d wide: RMSNorm, attention (head dim 2d / h, scores scaled by
(hd / 2)^-0.5, RoPE when the model has positions), RMSNorm of its output, then a gated MLP.
No residual inside it. Its output, through the layer's `linear`, is added to x before the
layer's Mamba2 norm; the layer's residual is x itself:

    t   = linear(mlp(norm2(attn(norm1(concat(x, e))))))
    out = x + mamba2(norm(x + t))          (this module returns mamba2(norm(x + t)))

Each hybrid layer has its own LoRA adapters (down to rank r, back up) added to the shared
gate_up projection and, with `zamba2_attention_adapter`, to q, k and v. Mirrors
transformers' `Zamba2HybridLayer`.

Glossary: b batch, l sequence length, p past length, d hidden size, e embeddings [b, l, d],
h heads, h_kv key/value heads, hd = 2d / h, f intermediate size, r adapter rank.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ...config import HybridConfig
from ...kinds import Zamba2Params
from ..context import MixerContext
from ..layers import RMSNorm, activation
from ..ops import UsesFusedOps, attend
from .mamba2 import Mamba2Mixer

KIND = "zamba2_hybrid"


class _Proj(nn.Module):
    """q/k/v/o projections of the shared attention (names as transformers' `self_attn`)."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        a, hd = 2 * cfg.hidden_size, cfg.attn_head_dim
        self.q_proj = nn.Linear(a, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(a, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(a, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)


class _Mlp(nn.Module):
    """Gated MLP of the shared block: gate_up_proj [2f, d] (gate first), down_proj [d, f]."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_up_proj = nn.Linear(d, 2 * f, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(f, d, bias=cfg.mlp_bias)


class SharedBlock(nn.Module):
    """The weights one shared transformer block holds (params `model.shared.blocks.{j}...`)."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(2 * cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = _Proj(cfg)
        self.pre_ff_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = _Mlp(cfg)


def _adapter(n_in: int, rank: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, rank, bias=False), nn.Linear(rank, n_out, bias=False))


class Zamba2Hybrid(UsesFusedOps, nn.Module):
    """x [b, l, d] (raw: the kind has no pre-norm), ctx (past_lengths, cos/sin, embeds),
    key/value [b, h_kv, C, hd], conv, ssm -> (y [b, l, d], key', value' [b, h_kv, C, hd], conv', ssm')."""

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        assert shared is not None, "zamba2_hybrid layers share their transformer blocks through model.shared"
        p = cfg.params(Zamba2Params)
        if "blocks" not in shared:  # as many as the hybrid layers use (transformers builds no more)
            used = min(p.zamba2_mem_blocks, cfg.layer_types.count(KIND))
            shared["blocks"] = nn.ModuleList(SharedBlock(cfg) for _ in range(used))
        index = cfg.layer_types[:layer].count(KIND)  # this layer's rank among the hybrid layers
        # A plain list, so the block's parameters keep their one name under model.shared.
        blocks = cast(nn.ModuleList, shared["blocks"])
        self._block: list[SharedBlock] = [cast(SharedBlock, blocks[index % p.zamba2_mem_blocks])]
        d, a, r = cfg.hidden_size, 2 * cfg.hidden_size, p.zamba2_adapter_rank
        self.h, self.h_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attn_head_dim
        self.scale = (self.hd / 2) ** -0.5
        self.attention_adapter = p.zamba2_attention_adapter
        if self.attention_adapter:
            self.q_adapter = _adapter(a, r, self.h * self.hd)
            self.k_adapter = _adapter(a, r, self.h_kv * self.hd)
            self.v_adapter = _adapter(a, r, self.h_kv * self.hd)
        self.gate_up_adapter = _adapter(d, r, 2 * cfg.intermediate_size)
        self.act = activation(cfg.hidden_act)
        self.linear = nn.Linear(d, d, bias=False)
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.mamba = Mamba2Mixer(cfg, layer)

    def _attention(
        self, x: torch.Tensor, ctx: MixerContext, past_k: torch.Tensor, past_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [b, l, 2d] normed -> (o [b, l, d], k, v [b, h_kv, C, hd])."""
        proj = self._block[0].self_attn
        q, k, v = proj.q_proj(x), proj.k_proj(x), proj.v_proj(x)
        if self.attention_adapter:
            q, k, v = q + self.q_adapter(x), k + self.k_adapter(x), v + self.v_adapter(x)
        y, k, v = attend(q, k, v, past_k, past_v, ctx, self.scale, fused=self.fused)
        return proj.o_proj(y), k, v

    def forward(
        self,
        x: torch.Tensor,
        ctx: MixerContext,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        block = self._block[0]
        h = block.input_layernorm(torch.cat([x, ctx.embeds], dim=-1))  # [b, l, 2d]
        t, k, v = self._attention(h, ctx, past_k, past_v)
        t = block.pre_ff_layernorm(t)
        gate, up = (block.feed_forward.gate_up_proj(t) + self.gate_up_adapter(t)).chunk(2, dim=-1)
        t = self.linear(block.feed_forward.down_proj(self.act(gate) * up))
        y, conv_state, ssm_state = self.mamba(self.norm(x + t), ctx, conv_state, ssm_state)
        return y, k, v, conv_state, ssm_state
