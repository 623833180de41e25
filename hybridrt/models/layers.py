"""Attention and feed-forward blocks with explicit state.

Glossary (see HybridConfig): b batch, l sequence length of this call, p past length,
d hidden size, h heads, h_kv key/value heads, hd head dim, E experts, f intermediate size.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from ..config import HybridConfig, Multipliers
from ..ffn_kinds import MoEParams
from .context import MixerContext
from .ops import UsesFusedOps, attend, moe


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def activation(name: str) -> nn.Module:
    acts: dict[str, type[nn.Module]] = {"silu": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU}
    if name not in acts:
        raise ValueError(f"unsupported hidden_act {name!r}; supported: {', '.join(acts)}")
    return acts[name]()


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)). x [b, l, d] -> [b, l, d]."""

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(d, f, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(f, d, bias=cfg.mlp_bias)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class MoE(UsesFusedOps, nn.Module):
    """Top-k mixture of gated-MLP experts (softmax router; Jamba keeps the top-k weights as they
    are, Granite renormalizes them, which equals a softmax over the top-k logits).

    Every expert runs on every token and unselected experts get weight 0: exact, shape-static
    and export-friendly (no data-dependent gather). x [b, l, d] -> [b, l, d].
    Weights: router.weight [E, d], experts.gate_up_proj [E, 2f, d], experts.down_proj [E, d, f].
    """

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        moe = cfg.params(MoEParams)
        d, f, e = cfg.hidden_size, cfg.intermediate_size, moe.num_experts
        self.top_k, self.renormalize = moe.num_experts_per_tok, moe.moe_renormalize
        self.router = nn.Linear(d, e, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(nn.init.zeros_(torch.empty(e, 2 * f, d)))
        self.experts.down_proj = nn.Parameter(nn.init.zeros_(torch.empty(e, d, f)))
        self.act = activation(cfg.hidden_act)
        self.silu = cfg.hidden_act == "silu"  # what onnxruntime's MoE computes (ops.moe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and self.silu:
            flat = x.reshape(-1, x.shape[-1])  # [b*l, d]: the op routes each token on its own
            gate_up, down = cast(torch.Tensor, self.experts.gate_up_proj), cast(torch.Tensor, self.experts.down_proj)
            y = moe(flat, self.router(flat), gate_up, down, self.top_k, self.renormalize, fused=True)
            return y.reshape(x.shape)
        probs = torch.softmax(self.router(x).float(), dim=-1)  # [b, l, E]
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(-1, top_i, top_w).to(x.dtype)  # [b, l, E]
        gate_up = torch.einsum("bld,efd->blef", x, self.experts.gate_up_proj)  # [b, l, E, 2f]
        gate, up = gate_up.chunk(2, dim=-1)
        y = torch.einsum("blef,edf->bled", self.act(gate) * up, self.experts.down_proj)
        return (y * weights.unsqueeze(-1)).sum(dim=2)


def rope_inv_freq(cfg: HybridConfig) -> torch.Tensor:
    """Inverse frequencies [rd/2] for the config's rope type (transformers' rope utils);
    rd = cfg.rotary_dim, the head dim unless the rotary is partial."""
    hd = cfg.rotary_dim
    assert cfg.rope_theta is not None
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    params = dict(cfg.rope_scaling)
    if cfg.rope_type == "linear":
        inv = inv / params["factor"]
    elif cfg.rope_type == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class Attention(UsesFusedOps, nn.Module):
    """Grouped-query causal attention with optional RoPE over fixed-size KV buffers.

    x [b, l, d]; ctx.past_lengths [b], ctx.cos/sin [b, l, rd] or None; past_k/past_v
    [b, h_kv, C, hd] -> (y [b, l, d], present_k/present_v [b, h_kv, C, hd]): the new keys and
    values land at positions past_lengths .. past_lengths + l - 1 (see ops.kv_attention).
    """

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.attn_head_dim
        self.h, self.h_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        # Gated attention (Qwen3-Next): q_proj yields [query (hd), gate (hd)] per head.
        self.output_gate = cfg.attn_output_gate
        self.q_proj = nn.Linear(d, self.h * hd * (2 if self.output_gate else 1), bias=cfg.attention_bias)
        self.k_proj = nn.Linear(d, self.h_kv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(d, self.h_kv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.h * hd, d, bias=cfg.attention_bias)
        self.qk_norm = cfg.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        scale = cfg.params(Multipliers).attention_multiplier
        self.scale = scale if scale is not None else hd**-0.5

    def forward(
        self, x: torch.Tensor, ctx: MixerContext, past_k: torch.Tensor, past_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, l, _ = x.shape
        h, hd = self.h, self.hd
        gate = None
        if self.output_gate:
            q4, gate = self.q_proj(x).view(b, l, h, 2 * hd).chunk(2, dim=-1)
            q, gate = q4.reshape(b, l, h * hd), gate.reshape(b, l, h * hd)
        else:
            q = self.q_proj(x)  # token-major [b, l, h hd], as GroupQueryAttention takes it
        k, v = self.k_proj(x), self.v_proj(x)
        if self.qk_norm:
            q, k = self.norm_qk(q, k)
        y, k, v = attend(q, k, v, past_k, past_v, ctx, self.scale, fused=self.fused)
        if gate is not None:
            y = y * torch.sigmoid(gate)
        return self.o_proj(y), k, v

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [b, l, h hd], k [b, l, h_kv hd] -> the same, RMSNorm over each head."""
        b, l = q.shape[0], q.shape[1]
        q = self.q_norm(q.view(b, l, self.h, self.hd)).reshape(b, l, self.h * self.hd)
        k = self.k_norm(k.view(b, l, self.h_kv, self.hd)).reshape(b, l, self.h_kv * self.hd)
        return q, k


def rope_cos_sin(inv_freq: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids [b, l] -> cos, sin [b, l, rd]."""
    freqs = position_ids.unsqueeze(-1).float() * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()
