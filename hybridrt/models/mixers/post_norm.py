"""Post-norm layers (OLMo 2 and 3, OLMo Hybrid's attention layers): the layer's input reaches
the attention and the MLP as it is, and an RMSNorm on each one's output comes before the
residual add: x + norm(attn(x)), then x + norm(mlp(x)). Mirrors transformers'
`Olmo3DecoderLayer` and `Olmo3Attention`.

Glossary: b batch, l sequence length of this call, d hidden size, h heads, h_kv key/value
heads, hd head dim, C KV capacity.
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import HybridConfig
from ..context import MixerContext
from ..layers import MLP, Attention, RMSNorm


class PostNormAttention(Attention):
    """Kind `post_norm_attention`: x [b, l, d] (not normed), past_k/past_v [b, h_kv, C, hd] ->
    (post_norm(attn(x)) [b, l, d], present_k, present_v). q and k are RMSNormed over all heads
    at once (q_norm [h hd], k_norm [h_kv hd]), before RoPE."""

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__(cfg, layer, shared)
        self.qk_norm = True
        self.q_norm = RMSNorm(self.h * self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.h_kv * self.hd, cfg.rms_norm_eps)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)

    def forward(
        self, x: torch.Tensor, ctx: MixerContext, past_k: torch.Tensor, past_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, k, v = super().forward(x, ctx, past_k, past_v)
        return self.post_norm(y), k, v


class PostNormMLP(MLP):
    """Feed-forward `post_norm_mlp`: x [b, l, d] (not normed) -> post_norm(mlp(x)) [b, l, d]."""

    prenorm = False  # models.decoder.Block gives it no norm before

    def __init__(self, cfg: HybridConfig, layer: int = 0) -> None:
        super().__init__(cfg, layer)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post_norm(super().forward(x))
