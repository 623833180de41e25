"""Mamba1 mixer: selective SSM with a depthwise causal conv (Gu & Dao 2023, Algorithm 2).

Glossary: b batch, l sequence length, d hidden size, d_inner expanded size, n d_state,
k d_conv, r dt_rank. Mirrors transformers' `JambaMambaMixer` / `MambaMixer` slow path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import HybridConfig
from .context import MixerContext
from .layers import RMSNorm
from .ops import causal_conv, selective_scan


class WeightlessRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) in float32, no scale (Falcon-Mamba's dt/B/C norms)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class MambaMixer(nn.Module):
    """x [b, l, d], conv [b, d_inner, k-1], ssm [b, n, d_inner] -> (y, conv', ssm')."""

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        d, di, n, r, k = cfg.hidden_size, cfg.d_inner, cfg.mamba_d_state, cfg.dt_rank, cfg.mamba_d_conv
        self.d_inner, self.n, self.r = di, n, r
        self.chunk, self.max_len = cfg.scan_chunk, cfg.max_position_embeddings
        self.in_proj = nn.Linear(d, 2 * di, bias=cfg.mamba_proj_bias)
        self.conv1d = nn.Conv1d(di, di, k, groups=di, bias=cfg.mamba_conv_bias)
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di, bias=True)
        self.A_log = nn.Parameter(torch.zeros(di, n))
        self.D = nn.Parameter(torch.ones(di))
        self.out_proj = nn.Linear(di, d, bias=cfg.mamba_proj_bias)
        self.inner_norms = cfg.mamba_inner_norms
        if self.inner_norms:
            eps = cfg.rms_norm_eps if cfg.mamba_inner_norm_eps is None else cfg.mamba_inner_norm_eps
            norm = RMSNorm if cfg.mamba_inner_norm_weights else WeightlessRMSNorm
            self.dt_norm, self.b_norm, self.c_norm = norm(r, eps), norm(n, eps), norm(n, eps)

    def forward(
        self, x: torch.Tensor, ctx: MixerContext, conv_state: torch.Tensor, ssm_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xz = self.in_proj(x)
        xs, z = xz.chunk(2, dim=-1)  # [b, l, d_inner] each
        xs, conv_state = causal_conv(xs.transpose(1, 2), conv_state, self.conv1d.weight, self.conv1d.bias, silu=True)
        xs = xs.transpose(1, 2)  # [b, l, d_inner]
        dt, B, C = torch.split(self.x_proj(xs), [self.r, self.n, self.n], dim=-1)
        if self.inner_norms:
            dt, B, C = self.dt_norm(dt), self.b_norm(B), self.c_norm(C)
        dt = F.softplus(self.dt_proj(dt))  # [b, l, d_inner]
        A = -torch.exp(self.A_log.float()).t()  # [n, d_inner]
        y, ssm_state = selective_scan(dt * xs, dt, A, B, C, ssm_state, self.chunk, self.max_len)
        y = y + xs * self.D  # [b, l, d_inner]
        y = y * F.silu(z)
        return self.out_proj(y), conv_state, ssm_state
