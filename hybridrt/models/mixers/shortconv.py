"""LFM2's short-conv mixer: input-gated depthwise causal conv, output-gated.

Glossary: b batch, l sequence length, d hidden size, k conv_kernel.
Mirrors transformers' `Lfm2ShortConv.slow_forward`: in_proj -> B, C, x; y = C * conv(B * x).
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import HybridConfig
from ...kinds import ShortConvParams
from ..context import MixerContext
from ..ops import UsesFusedOps, causal_conv


class ShortConv(UsesFusedOps, nn.Module):
    """x [b, l, d], conv [b, d, k-1] -> (y [b, l, d], conv')."""

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        d, p = cfg.hidden_size, cfg.params(ShortConvParams)
        self.in_proj = nn.Linear(d, 3 * d, bias=p.conv_bias)
        self.conv = nn.Conv1d(d, d, p.conv_kernel, groups=d, bias=p.conv_bias)
        self.out_proj = nn.Linear(d, d, bias=p.conv_bias)

    def forward(
        self, x: torch.Tensor, ctx: MixerContext, conv_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        B, C, xs = self.in_proj(x).transpose(1, 2).chunk(3, dim=1)  # [b, d, l] each
        y, conv_state = causal_conv(B * xs, conv_state, self.conv.weight, self.conv.bias, fused=self.fused)
        return self.out_proj((C * y).transpose(1, 2)), conv_state
