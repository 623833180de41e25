"""Gated DeltaNet mixer (Qwen3-Next, Qwen3.5): delta-rule linear attention with a scalar
decay per head, after a depthwise causal conv over q, k and v, and a gated RMSNorm.

Glossary: b batch, l sequence length, d hidden size, Hk key heads, H value heads
(each key head serves H / Hk consecutive value heads), K key head dim, V value head dim,
k conv kernel, conv_dim = 2 Hk K + H V. Mirrors transformers' `Qwen3NextGatedDeltaNet` and
`Qwen3_5GatedDeltaNet` (torch path): q, k l2-normalized, q scaled by K^-1/2,
beta = sigmoid(b) (times gdn_beta_scale: OLMo Hybrid's `OlmoHybridGatedDeltaNet` doubles
it), g = -exp(A_log) softplus(a + dt_bias).
States: conv [b, conv_dim, k-1]; ssm [b, H, K, V] (transformers' and onnxruntime's layout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config import HybridConfig
from ...kinds import GatedDeltaParams
from ..context import MixerContext
from ..ops import UsesFusedOps, causal_conv, gated_delta


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last axis (the FLA library's form)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class NormGated(nn.Module):
    """RMSNorm per head, then times silu(z) (transformers' `Qwen3NextRMSNormGated`: the norm
    comes first, unlike Mamba2's). y, z [..., V] -> [..., V]."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = y.dtype
        h = y.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(z.float())).to(dtype)


class GatedDeltaNet(UsesFusedOps, nn.Module):
    """x [b, l, d], conv [b, conv_dim, k-1], ssm [b, H, K, V] -> (y [b, l, d], conv', ssm').

    Weights: Qwen3-Next's in_proj_qkvz [Hk (2K + 2 (H/Hk) V), d] and in_proj_ba [2H, d], rows
    grouped per key head; or (gdn_split_proj) Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a.
    """

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        d, p = cfg.hidden_size, cfg.params(GatedDeltaParams)
        self.Hk, self.H, self.K, self.V = p.gdn_k_heads, p.gdn_v_heads, p.gdn_k_head_dim, p.gdn_v_head_dim
        self.rep = self.H // self.Hk
        self.key_dim, self.value_dim = self.Hk * self.K, self.H * self.V
        self.conv_dim = p.gdn_conv_dim
        self.chunk, self.max_len = cfg.scan_chunk, cfg.max_position_embeddings
        self.split = p.gdn_split_proj
        if self.split:
            self.in_proj_qkv = nn.Linear(d, self.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(d, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(d, self.H, bias=False)
            self.in_proj_a = nn.Linear(d, self.H, bias=False)
        else:
            self.in_proj_qkvz = nn.Linear(d, self.conv_dim + self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(d, 2 * self.H, bias=False)
        k = p.gdn_conv_kernel
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, k, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.H))
        self.A_log = nn.Parameter(torch.zeros(self.H))
        self.norm = NormGated(self.V, p.gdn_norm_eps if p.gdn_norm_eps is not None else cfg.rms_norm_eps)
        self.beta_scale = p.gdn_beta_scale
        self.out_proj = nn.Linear(self.value_dim, d, bias=False)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [b, l, d] -> qkv [b, l, conv_dim] (q, k, v side by side), z [b, l, H, V], b, a [b, l, H]."""
        bsz, l = x.shape[0], x.shape[1]
        if self.split:
            z = self.in_proj_z(x).view(bsz, l, self.H, self.V)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        # Rows grouped per key head: [q (K), k (K), v (rep V), z (rep V)] and [b (rep), a (rep)].
        qkvz = self.in_proj_qkvz(x).view(bsz, l, self.Hk, 2 * self.K + 2 * self.rep * self.V)
        q, k, v, z = torch.split(qkvz, [self.K, self.K, self.rep * self.V, self.rep * self.V], dim=3)
        ba = self.in_proj_ba(x).view(bsz, l, self.Hk, 2 * self.rep)
        b, a = torch.split(ba, [self.rep, self.rep], dim=3)
        qk_dim = self.Hk * self.K  # sizes spelled out: the graph holds constants, not a -1 to resolve
        qkv = torch.cat(
            [q.reshape(bsz, l, qk_dim), k.reshape(bsz, l, qk_dim), v.reshape(bsz, l, self.H * self.V)], dim=-1
        )
        return qkv, z.reshape(bsz, l, self.H, self.V), b.reshape(bsz, l, self.H), a.reshape(bsz, l, self.H)

    def forward(
        self, x: torch.Tensor, ctx: MixerContext, conv_state: torch.Tensor, ssm_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bsz, l = x.shape[0], x.shape[1]
        qkv, z, b, a = self._project(x)
        qkv, conv_state = causal_conv(
            qkv.transpose(1, 2), conv_state, self.conv1d.weight, None, silu=True, fused=self.fused
        )
        qkv = qkv.transpose(1, 2)  # [b, l, conv_dim]
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(bsz, l, self.Hk, self.K).float()) * self.K**-0.5
        k = l2norm(k.reshape(bsz, l, self.Hk, self.K).float())
        if self.rep > 1:  # key head i serves value heads i*rep .. i*rep+rep-1
            q = q.repeat_interleave(self.rep, dim=2)
            k = k.repeat_interleave(self.rep, dim=2)
        v = v.reshape(bsz, l, self.H, self.V).float()
        beta = torch.sigmoid(b.float())
        if self.beta_scale != 1.0:  # OLMo's allow_neg_eigval: beta in [0, 2]
            beta = beta * self.beta_scale
        g = -torch.exp(self.A_log.float()) * F.softplus(a.float() + self.dt_bias)
        y, ssm_state = gated_delta(q, k, v, g, beta, ssm_state, self.chunk, self.max_len, fused=self.fused)
        y = self.norm(y.to(x.dtype), z)  # [b, l, H, V]
        return self.out_proj(y.reshape(bsz, l, self.value_dim)), conv_state, ssm_state
