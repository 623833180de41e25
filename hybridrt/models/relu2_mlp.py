"""Nemotron-H's feed-forward: a non-gated MLP with squared ReLU (So et al. 2021, Primer).

Glossary: b batch, l sequence length, d hidden size, f intermediate size.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import HybridConfig


class Relu2MLP(nn.Module):
    """down(relu(up(x))^2). x [b, l, d] -> [b, l, d]."""

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.up_proj = nn.Linear(d, f, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(f, d, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.square(torch.relu(self.up_proj(x))))
