"""Falcon-H1's layer: attention and a Mamba2 mixer read the same normed input side by side and
their outputs are summed, each with its muP multipliers; the feed-forward is a gated MLP with
multipliers on its gate and output.

Glossary: b batch, l sequence length, p past length, d hidden size, h_kv key/value heads,
hd head dim, H mamba2 heads, P mamba2 head_dim, G groups, n d_state, k d_conv,
d_ssm = H P, conv_dim = d_ssm + 2 G n. Mirrors transformers' `FalconH1DecoderLayer`,
`FalconH1Mixer` (torch path) and `FalconH1MLP`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config import HybridConfig
from ...kinds import ParallelHybridParams
from ..context import MixerContext
from ..layers import MLP, Attention
from ..ops import causal_conv
from .mamba2 import GatedRMSNorm, Mamba2Mixer


class GroupRMSNormThenGate(GatedRMSNorm):
    """RMSNorm of y over groups of `group_size` channels, then times silu(z) (transformers'
    `FalconH1RMSNormGated` with norm_before_gate). y, z [b, l, d_ssm] -> [b, l, d_ssm]."""

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = y.dtype
        h = self.weight * self.grouped(y.float())
        return (h * F.silu(z.float())).to(dtype)


class FalconH1Mamba(Mamba2Mixer):
    """The Mamba2 mixer with Falcon-H1's differences: the input times ssm_in_multiplier, the
    in_proj output times a per-part vector (z, x, B, C, dt), out_proj bias from
    `mamba2_out_bias`, and the gated norm optional (none: y * silu(z)) or normalizing first.

    x [b, l, d], conv [b, conv_dim, k-1], ssm [b, H, n, P] -> (y [b, l, d], conv', ssm')."""

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__(cfg, layer, shared)
        di, gn, p = self.d_inner, self.G * self.n, cfg.params(ParallelHybridParams)
        self.out_proj = nn.Linear(di, cfg.hidden_size, bias=p.mamba2_out_bias)
        self.gated_norm = p.mamba2_gated_norm
        # `norm` keeps its checkpoint name: none (no weight), or normalizing before the gate
        if not p.mamba2_gated_norm:
            self.add_module("norm", nn.Identity())
        elif p.mamba2_norm_before_gate:
            self.add_module("norm", GroupRMSNormThenGate(di, di // self.G, cfg.rms_norm_eps))
        self.in_multiplier = p.ssm_in_multiplier
        mz, mx, mb, mc, mdt = p.ssm_multipliers
        parts = [(di, mz), (di, mx), (gn, mb), (gn, mc), (self.H, mdt)]
        mup = torch.cat([torch.full((size,), float(m)) for size, m in parts])  # [d_ssm + conv_dim + H]
        self.mup: torch.Tensor
        self.register_buffer("mup", mup, persistent=False)

    def forward(
        self, x: torch.Tensor, ctx: MixerContext, conv_state: torch.Tensor, ssm_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        zxbcdt = self.in_proj(x * self.in_multiplier) * self.mup
        z, xbc, dt = torch.split(zxbcdt, [self.d_inner, self.conv_dim, self.H], dim=-1)
        xbc, conv_state = causal_conv(
            xbc.transpose(1, 2), conv_state, self.conv1d.weight, self.conv1d.bias, silu=True, fused=self.fused
        )
        xbc = xbc.transpose(1, 2)  # [b, l, conv_dim]
        xs, B, C = torch.split(xbc, [self.d_inner, self.G * self.n, self.G * self.n], dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # [b, l, H]
        y, ssm_state = self._ssm(xs, dt, B, C, ssm_state)  # [b, l, d_ssm]
        y = self.norm(y, z) if self.gated_norm else y * F.silu(z)
        return self.out_proj(y), conv_state, ssm_state


class ParallelHybrid(nn.Module):
    """attn_out * attention(x * attn_in) + ssm_out * mamba(x), on the same normed x.

    x [b, l, d], ctx (past_lengths, cos/sin), past_k/past_v [b, h_kv, C, hd], conv [b, conv_dim, k-1],
    ssm [b, H, n, P] -> (y [b, l, d], k', v' [b, h_kv, C, hd], conv', ssm').
    The key multiplier is the config's attention_multiplier (it scales the scores alike).
    """

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer, shared)
        self.mamba = FalconH1Mamba(cfg, layer, shared)
        p = cfg.params(ParallelHybridParams)
        self.attn_in, self.attn_out, self.ssm_out = (
            p.attention_in_multiplier,
            p.attention_out_multiplier,
            p.ssm_out_multiplier,
        )

    def forward(
        self,
        x: torch.Tensor,
        ctx: MixerContext,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        s, conv_state, ssm_state = self.mamba(x, ctx, conv_state, ssm_state)
        a, k, v = self.self_attn(x * self.attn_in, ctx, past_k, past_v)
        return s * self.ssm_out + a * self.attn_out, k, v, conv_state, ssm_state


class ScaledMLP(MLP):
    """down(up(x) * act(gate(x) * m_gate)) * m_down (transformers' `FalconH1MLP`). x [b, l, d] -> [b, l, d]."""

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__(cfg, layer)
        self.m_gate, self.m_down = cfg.params(ParallelHybridParams).mlp_multipliers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.up_proj(x) * self.act(self.gate_proj(x) * self.m_gate)) * self.m_down
