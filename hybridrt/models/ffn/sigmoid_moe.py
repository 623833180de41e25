"""Sigmoid-routed mixture of gated-MLP experts (LFM2-MoE): a per-expert bias steers the top-k
choice only, the chosen sigmoid scores are optionally renormalized and then scaled.

Glossary: b batch, l sequence length, d hidden size, E experts, f moe_intermediate_size.
Mirrors transformers' `Lfm2MoeSparseMoeBlock` (router `Lfm2MoeTopKRouter`, `Lfm2MoeExperts`).
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import HybridConfig
from ...ffn_kinds import MoEParams
from ..layers import activation


class SigmoidMoE(nn.Module):
    """x [b, l, d] -> [b, l, d].

    Every expert runs on every token and unselected experts get weight 0: exact, shape-static
    and export-friendly (no data-dependent gather), like `layers.MoE`.
    Weights: router.weight [E, d], expert_bias [E] (a buffer, when `moe_expert_bias`),
    experts.gate_up_proj [E, 2f, d], experts.down_proj [E, d, f].
    """

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        moe = cfg.params(MoEParams)
        d, e = cfg.hidden_size, moe.num_experts
        f = moe.moe_intermediate_size or cfg.intermediate_size
        self.top_k, self.renormalize, self.scaling = (
            moe.num_experts_per_tok,
            moe.moe_renormalize,
            moe.moe_routed_scaling,
        )
        self.router = nn.Linear(d, e, bias=False)
        self.expert_bias: torch.Tensor | None
        if moe.moe_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(e))
        else:
            self.expert_bias = None
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(nn.init.zeros_(torch.empty(e, 2 * f, d)))
        self.experts.down_proj = nn.Parameter(nn.init.zeros_(torch.empty(e, d, f)))
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.sigmoid(self.router(x).float())  # [b, l, E]
        if self.expert_bias is not None:
            _, top_i = torch.topk(scores + self.expert_bias, self.top_k, dim=-1)
            top_w = torch.gather(scores, -1, top_i)
        else:
            top_w, top_i = torch.topk(scores, self.top_k, dim=-1)
        if self.renormalize:
            top_w = top_w / (top_w.sum(-1, keepdim=True) + 1e-6)
        top_w = top_w * self.scaling
        weights = torch.zeros_like(scores).scatter(-1, top_i, top_w).to(x.dtype)  # [b, l, E]
        gate_up = torch.einsum("bld,efd->blef", x, self.experts.gate_up_proj)  # [b, l, E, 2f]
        gate, up = gate_up.chunk(2, dim=-1)
        y = torch.einsum("blef,edf->bled", self.act(gate) * up, self.experts.down_proj)
        return (y * weights.unsqueeze(-1)).sum(dim=2)
