"""Nemotron-H's feed-forward: a non-gated MLP with squared ReLU (So et al. 2021, Primer).

Glossary: b batch, l sequence length, d hidden size, f intermediate size.
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import HybridConfig
from ...ffn_kinds import MoEParams, NemotronMoEParams, SharedExpertParams


class Relu2MLP(nn.Module):
    """down(relu(up(x))^2). x [b, l, d] -> [b, l, d]."""

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.up_proj = nn.Linear(d, f, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(f, d, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.square(torch.relu(self.up_proj(x))))


class _Router(nn.Module):
    """weight [E, d]; e_score_correction_bias [E] shifts the choice of experts, not their weights."""

    def __init__(self, experts: int, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(experts, d))
        self.register_buffer("e_score_correction_bias", torch.zeros(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, l, d] -> sigmoid scores [b, l, E] in float32 (its nodes stay float: */ffn/router/*)."""
        return torch.sigmoid(torch.matmul(x.float(), self.weight.float().t()))


class NemotronMoE(nn.Module):
    """Nemotron-H's MoE (transformers' `NemotronHMoE`, router as DeepSeek-V3's). x [b, l, d] -> [b, l, d].
    Glossary: E experts, k latent size (d without a latent projection).

    s = sigmoid(x W^T) [b, l, E]; the experts are chosen on s + bias: the `moe_topk_groups`
    best of `moe_groups` groups (a group scores the sum of its two best), then the top k
    within them; their weights are s (renormalized to sum 1 when moe_renormalize) times
    moe_routed_scaling. Every expert runs on every token, unselected ones weighted 0 (exact
    and export-friendly, as layers.MoE; one MatMul pair per expert, so each quantizes).
    y = fc2(sum_e w_e expert_e(fc1(x))) + shared(x).
    """

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__()
        moe, nemotron = cfg.params(MoEParams), cfg.params(NemotronMoEParams)
        d, e = cfg.hidden_size, moe.num_experts
        k = nemotron.moe_latent_size or d
        self.top_k, self.renormalize, self.scale = moe.num_experts_per_tok, moe.moe_renormalize, moe.moe_routed_scaling
        self.groups, self.topk_groups = nemotron.moe_groups, nemotron.moe_topk_groups
        self.router = _Router(e, d)
        # One module per expert, as checkpoints store them (`experts.{e}.up_proj.weight`).
        self.routed_experts = nn.ModuleList(_Expert(k, moe.moe_intermediate_size, False) for _ in range(e))
        shared = cfg.params(SharedExpertParams).shared_intermediate_size
        self.shared_experts = _Expert(d, shared, cfg.mlp_bias)
        self.latent = nemotron.moe_latent_size > 0
        if self.latent:
            self.fc1_latent_proj = nn.Linear(d, k, bias=cfg.mlp_bias)
            self.fc2_latent_proj = nn.Linear(k, d, bias=cfg.mlp_bias)

    def _weights(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, l, d] -> routing weights [b, l, E], zero for unselected experts."""
        scores = self.router(x)  # [b, l, E]
        bias = self.router.e_score_correction_bias
        assert isinstance(bias, torch.Tensor)
        choice = scores + bias
        if self.topk_groups < self.groups:
            b, l, e = choice.shape
            grouped = choice.view(b, l, self.groups, e // self.groups)
            group_scores = grouped.topk(2, dim=-1)[0].sum(-1)  # [b, l, groups]
            group_idx = group_scores.topk(self.topk_groups, dim=-1)[1]
            keep = torch.zeros_like(group_scores).scatter(-1, group_idx, 1.0)
            keep = keep.unsqueeze(-1).expand(b, l, self.groups, e // self.groups).reshape(b, l, e)
            choice = choice.masked_fill(keep == 0, float("-inf"))
        top_i = choice.topk(self.top_k, dim=-1)[1]
        top_w = scores.gather(-1, top_i)
        if self.renormalize:
            top_w = top_w / (top_w.sum(-1, keepdim=True) + 1e-20)
        return torch.zeros_like(scores).scatter(-1, top_i, top_w * self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self._weights(x).to(x.dtype)
        h = self.fc1_latent_proj(x) if self.latent else x
        y = sum(expert(h) * weights[..., e : e + 1] for e, expert in enumerate(self.routed_experts))  # [b, l, k]
        assert isinstance(y, torch.Tensor)
        if self.latent:
            y = self.fc2_latent_proj(y)
        return y + self.shared_experts(x)


class _Expert(nn.Module):
    """down(relu(up(x))^2), x [b, l, d] -> [b, l, d] (one routed expert, or the shared one)."""

    def __init__(self, d: int, f: int, bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.square(torch.relu(self.up_proj(x))))
