"""Mamba1 mixer: selective SSM with a depthwise causal conv (Gu & Dao 2023, Algorithm 2).

Glossary: b batch, l sequence length, d hidden size, d_inner expanded size, n d_state,
k d_conv, r dt_rank. Mirrors transformers' `JambaMambaMixer` / `MambaMixer` slow path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config import HybridConfig
from ...kinds import MambaParams
from ..context import MixerContext
from ..layers import RMSNorm
from ..ops import UsesFusedOps, causal_conv, selective_scan


class WeightlessRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) in float32, no scale (Falcon-Mamba's dt/B/C norms)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def stepped_selective_scan(
    xdt: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, h0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """selective_scan's recurrence with h stepped over time, for training in PyTorch.

    Same shapes as selective_scan: xdt, dt [b, l, d_inner], A [n, d_inner], B, C [b, l, n],
    h0 [b, n, d_inner] -> y [b, l, d_inner], h [b, n, d_inner]. The chunked scan is shaped
    for export and materializes several [b, l, n, d_inner] tensors per doubling step; its
    backward is ~10x slower than stepping h. The decays and inputs of every step are computed
    at once, so a step is one fused multiply-add (forward) and a few (backward): on a GPU the
    loop is bound by kernel launches, not arithmetic. Never traced: export uses the chunked scan.
    """
    decay = torch.exp(dt.unsqueeze(2) * A)  # [b, l, n, d_inner]
    inputs = B.unsqueeze(-1) * xdt.unsqueeze(2)  # [b, l, n, d_inner]
    h, hs = h0, []
    for decay_t, input_t in zip(decay.unbind(1), inputs.unbind(1), strict=True):  # unbind: one stack backward
        h = torch.addcmul(input_t, decay_t, h)
        hs.append(h)
    y = torch.einsum("blnh,bln->blh", torch.stack(hs, dim=1), C)
    return y, h


class MambaMixer(UsesFusedOps, nn.Module):
    """x [b, l, d], conv [b, d_inner, k-1], ssm [b, n, d_inner] -> (y, conv', ssm').

    `stepped_scan = True` (set on a mixer, as scripts/train_default_model.py does while it
    trains) runs the recurrence through `stepped_selective_scan` instead of the chunked scan: same
    parameters, same math, a faster backward; export never sets it.
    """

    stepped_scan = False

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        p, d = cfg.params(MambaParams), cfg.hidden_size
        di, n, r, k = p.d_inner(d), cfg.mamba_d_state, p.dt_rank(d), cfg.mamba_d_conv
        self.d_inner, self.n, self.r = di, n, r
        self.chunk, self.max_len = cfg.scan_chunk, cfg.max_position_embeddings
        self.in_proj = nn.Linear(d, 2 * di, bias=p.mamba_proj_bias)
        self.conv1d = nn.Conv1d(di, di, k, groups=di, bias=p.mamba_conv_bias)
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, di, bias=True)
        self.A_log = nn.Parameter(torch.zeros(di, n))
        self.D = nn.Parameter(torch.ones(di))
        self.out_proj = nn.Linear(di, d, bias=p.mamba_proj_bias)
        self.inner_norms = p.mamba_inner_norms
        if self.inner_norms:
            eps = cfg.rms_norm_eps if p.mamba_inner_norm_eps is None else p.mamba_inner_norm_eps
            norm = RMSNorm if p.mamba_inner_norm_weights else WeightlessRMSNorm
            self.dt_norm, self.b_norm, self.c_norm = norm(r, eps), norm(n, eps), norm(n, eps)

    def forward(
        self, x: torch.Tensor, ctx: MixerContext, conv_state: torch.Tensor, ssm_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xz = self.in_proj(x)
        xs, z = xz.chunk(2, dim=-1)  # [b, l, d_inner] each
        xs, conv_state = causal_conv(
            xs.transpose(1, 2), conv_state, self.conv1d.weight, self.conv1d.bias, silu=True, fused=self.fused
        )
        xs = xs.transpose(1, 2)  # [b, l, d_inner]
        dt, B, C = torch.split(self.x_proj(xs), [self.r, self.n, self.n], dim=-1)
        if self.inner_norms:
            dt, B, C = self.dt_norm(dt), self.b_norm(B), self.c_norm(C)
        dt = F.softplus(self.dt_proj(dt))  # [b, l, d_inner]
        A = -torch.exp(self.A_log.float()).t()  # [n, d_inner]
        if self.stepped_scan:
            y, ssm_state = stepped_selective_scan(dt * xs, dt, A, B, C, ssm_state)
        else:
            y, ssm_state = selective_scan(dt * xs, dt, A, B, C, ssm_state, self.chunk, self.max_len, fused=self.fused)
        y = y + xs * self.D  # [b, l, d_inner]
        y = y * F.silu(z)
        return self.out_proj(y), conv_state, ssm_state
