"""Routed experts beside a gated shared expert (Qwen3-Next's sparse MoE block):
y = moe(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x).

Glossary: b batch, l length, d hidden size, E experts, f the experts' width
(moe_intermediate_size), s the shared expert's width (shared_intermediate_size).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ...config import HybridConfig
from ...ffn_kinds import MoEParams, SharedExpertParams
from ..layers import MLP, MoE


class GatedSharedMoE(MoE):
    """x [b, l, d] -> [b, l, d]. Weights: router [E, d], experts.gate_up_proj [E, 2f, d],
    experts.down_proj [E, d, f], shared_expert.{gate,up,down}_proj, shared_expert_gate [1, d]."""

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        experts = cfg.params(MoEParams).moe_intermediate_size or cfg.intermediate_size
        super().__init__(dataclasses.replace(cfg, intermediate_size=experts))
        shared = cfg.params(SharedExpertParams).shared_intermediate_size
        self.shared_expert = MLP(dataclasses.replace(cfg, intermediate_size=shared))
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
