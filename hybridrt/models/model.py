"""The hybrid decoder: a stack of mixers chosen by `layer_types`, each with its state.

Glossary: b batch, l sequence length of this call, p past length, d hidden size, v vocab.
State in, state out: `forward` takes the flat list of past states in graph-contract order
(`hybridrt.graphs.contract.state_specs`) and returns logits and the present states.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..config import HybridConfig
from .layers import MLP, Attention, MoE, RMSNorm, attention_bias, rope_cos_sin, rope_inv_freq
from .mamba import MambaMixer
from .mamba2 import Mamba2Mixer
from .shared_ffn import SharedMLP, SharedMoE
from .shortconv import ShortConv

MIXERS: dict[str, type[nn.Module]] = {
    "attention": Attention,
    "mamba": MambaMixer,
    "mamba2": Mamba2Mixer,
    "conv": ShortConv,
}
FFNS: dict[str, type[nn.Module]] = {"mlp": MLP, "moe": MoE, "shared_mlp": SharedMLP, "shared_moe": SharedMoE}
STATES_PER_KIND = {"attention": 2, "mamba": 2, "mamba2": 2, "conv": 1}


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, cfg: HybridConfig, kind: str, ffn: str) -> None:
        super().__init__()
        self.kind = kind
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mixer = MIXERS[kind](cfg)
        self.ffn: nn.Module | None = None
        self.ffn_norm: nn.Module | None = None
        if ffn != "none":
            self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.ffn = FFNS[ffn](cfg)


class HybridModel(nn.Module):
    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, k, f) for k, f in zip(cfg.layer_types, cfg.ffn_types))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridForCausalLM(nn.Module):
    """input_ids [b, l], attention_mask [b, p+l], position_ids [b, l], states -> logits [b, l, v], states'.

    Logits come back for every position of the call: evaluation and speculative verification
    need them, and decode (l = 1) pays nothing for it.
    """

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = HybridModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq: torch.Tensor | None
        if cfg.uses_positions:
            self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        else:
            self.inv_freq = None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None,
        states: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        l = input_ids.shape[1]
        cfg = self.config
        x = self.model.embed_tokens(input_ids)
        if cfg.embedding_multiplier != 1.0:
            x = x * cfg.embedding_multiplier
        cos = sin = None
        if self.inv_freq is not None:
            assert position_ids is not None, "this model uses rotary positions: pass position_ids"
            cos, sin = rope_cos_sin(self.inv_freq, position_ids)
        bias = attention_bias(attention_mask, l) if "attention" in self.config.layer_types else None
        token_mask = attention_mask[:, attention_mask.shape[1] - l :]
        out: list[torch.Tensor] = []
        i = 0
        for layer in self.model.layers:
            block = cast(Block, layer)
            h = block.input_norm(x)
            n_states = STATES_PER_KIND[block.kind]
            past = states[i : i + n_states]
            if block.kind == "attention":
                assert bias is not None
                h, *present = block.mixer(h, bias, cos, sin, *past)
            else:
                h, *present = block.mixer(h, token_mask, *past)
            out += present
            i += n_states
            x = x + self._residual(h)
            if block.ffn is not None and block.ffn_norm is not None:
                x = x + self._residual(block.ffn(block.ffn_norm(x)))
        logits = self.lm_head(self.model.norm(x))
        if cfg.logits_scaling != 1.0:
            logits = logits / cfg.logits_scaling
        return logits, out

    def _residual(self, h: torch.Tensor) -> torch.Tensor:
        m = self.config.residual_multiplier
        return h if m == 1.0 else h * m
