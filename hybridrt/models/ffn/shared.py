"""Feed-forward blocks with a shared expert (Granite 4.0 H): a gated MLP whose gate and up
projections are one matrix, alone ("shared_mlp") or beside a routed MoE ("shared_moe").

Glossary: b batch, l sequence length, d hidden size, fs shared intermediate size.
Mirrors transformers' `GraniteMoeHybridMLP` and the FFN half of `GraniteMoeHybridDecoderLayer`.
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import HybridConfig
from ...ffn_kinds import SharedExpertParams
from ..layers import MoE, activation


class FusedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up stacked in input_linear [2fs, d]. x [b, l, d] -> [b, l, d]."""

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        d, f = cfg.hidden_size, cfg.params(SharedExpertParams).shared_intermediate_size
        self.input_linear = nn.Linear(d, 2 * f, bias=False)
        self.output_linear = nn.Linear(f, d, bias=False)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(self.act(gate) * up)


class SharedMLP(nn.Module):
    """The dense case: the shared expert alone."""

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        self.shared = FusedMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x)


class SharedMoE(nn.Module):
    """moe(x) + shared(x)."""

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        self.moe = MoE(cfg)
        self.shared = FusedMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x) + self.shared(x)
