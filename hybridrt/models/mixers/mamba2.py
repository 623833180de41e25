"""Mamba2 mixer: SSD with a scalar decay per head (Dao & Gu 2024), a depthwise causal conv
over x, B and C side by side, and a gated RMSNorm before the output projection.

Glossary: b batch, l sequence length, d hidden size, H heads, P head_dim, d_inner = H P,
G groups (B and C are shared by the H / G heads of a group), n d_state, k d_conv,
conv_dim = d_inner + 2 G n. Mirrors transformers' `Mamba2Mixer.torch_forward`
(and the same mixer in Bamba and GraniteMoeHybrid).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config import HybridConfig
from ...kinds import Mamba2Params
from ..context import MixerContext
from ..ops import UsesFusedOps, causal_conv, ssd_scan


class GatedRMSNorm(nn.Module):
    """RMSNorm of y * silu(z) over groups of `group_size` channels (transformers'
    `MambaRMSNormGated`: the gate multiplies first, then each group is normalized).
    y, z [b, l, d_inner] -> [b, l, d_inner]."""

    def __init__(self, dim: int, group_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group_size, self.eps = group_size, eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = y.dtype
        h = y.float() * F.silu(z.float())
        if self.group_size == h.shape[-1]:  # one group: a plain RMSNorm, which export fuses into one node
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * h.to(dtype)
        return self.weight * self.grouped(h).to(dtype)

    def grouped(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., d_inner] with each group of `group_size` channels RMS-normalized (no weight)."""
        shape = h.shape
        h = h.view(*shape[:-1], shape[-1] // self.group_size, self.group_size)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.view(shape)


class Mamba2Mixer(UsesFusedOps, nn.Module):
    """x [b, l, d], conv [b, conv_dim, k-1], ssm [b, H, n, P] -> (y [b, l, d], conv', ssm')."""

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        p = cfg.params(Mamba2Params)
        d, di, k = cfg.hidden_size, p.mamba2_d_inner, cfg.mamba_d_conv
        self.H, self.P, self.G, self.n = p.mamba2_heads, p.mamba2_head_dim, p.mamba2_groups, cfg.mamba_d_state
        self.d_inner, self.conv_dim = di, p.mamba2_conv_dim(cfg.mamba_d_state)
        self.chunk, self.max_len = cfg.scan_chunk, cfg.max_position_embeddings
        self.in_proj = nn.Linear(d, di + self.conv_dim + self.H, bias=p.mamba2_proj_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, k, groups=self.conv_dim, bias=p.mamba2_conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(self.H))
        self.A_log = nn.Parameter(torch.zeros(self.H))
        self.D = nn.Parameter(torch.ones(self.H))
        eps = p.mamba2_norm_eps if p.mamba2_norm_eps is not None else cfg.rms_norm_eps
        self.norm = GatedRMSNorm(di, di // self.G, eps)
        self.dt_min = p.mamba2_dt_min
        self.out_proj = nn.Linear(di, d, bias=p.mamba2_proj_bias)

    def _ssm(
        self, xs: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor, ssm_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """xs [b, l, d_inner], dt [b, l, H] (after softplus), B, C [b, l, G n] -> (scan output
        plus the D skip [b, l, d_inner], ssm'), all in the packed channel layout."""
        A = -torch.exp(self.A_log.float())  # [H]
        y, ssm_state = ssd_scan(xs, dt, A, B, C, ssm_state, self.chunk, self.max_len, fused=self.fused)
        return y + xs * self.D.repeat_interleave(self.P), ssm_state

    def forward(
        self, x: torch.Tensor, ctx: MixerContext, conv_state: torch.Tensor, ssm_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z, xbc, dt = torch.split(self.in_proj(x), [self.d_inner, self.conv_dim, self.H], dim=-1)
        xbc, conv_state = causal_conv(
            xbc.transpose(1, 2), conv_state, self.conv1d.weight, self.conv1d.bias, silu=True, fused=self.fused
        )
        xbc = xbc.transpose(1, 2)  # [b, l, conv_dim]
        xs, B, C = torch.split(xbc, [self.d_inner, self.G * self.n, self.G * self.n], dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # [b, l, H]
        if self.dt_min > 0.0:  # Zamba2 (time_step_min), Nemotron-H (time_step_limit): transformers'
            dt = dt.clamp(min=self.dt_min)  # chunked scan clamps; its one-token step does not, here both do
        y, ssm_state = self._ssm(xs, dt, B, C, ssm_state)
        return self.out_proj(self.norm(y, z)), conv_state, ssm_state
