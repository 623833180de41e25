"""The hybrid decoder: a stack of mixers chosen by `layer_types`, each with its state.

Each layer's mixer and feed-forward come from the kinds table (`hybridrt.kinds`), so this
file names no kind: every mixer is called as `mixer(norm(x), ctx, *past) -> (y, *present)`.

Glossary: b batch, l sequence length of this call, p past length, d hidden size, v vocab.
State in, state out: `forward` takes the flat list of past states in graph-contract order
(`hybridrt.graphs.contract.state_specs`) and returns logits and the present states.
"""

from __future__ import annotations

import importlib
from typing import cast

import torch
from torch import nn

from ..config import HybridConfig
from ..kinds import FFN_KINDS, layer_kind
from .context import MixerContext
from .layers import RMSNorm, attention_bias, rope_cos_sin, rope_inv_freq


def _resolve(path: str) -> type[nn.Module]:
    """ "package.module:Class" from the kinds table -> the class."""
    module, _, name = path.partition(":")
    return cast(type[nn.Module], getattr(importlib.import_module(module), name))


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, cfg: HybridConfig, layer: int, shared: nn.ModuleDict) -> None:
        super().__init__()
        self.kind = cfg.layer_types[layer]
        spec = layer_kind(self.kind)
        self.n_states = len(spec.states)
        self.mixer: nn.Module | None = None
        self.input_norm: nn.Module | None = None
        if spec.module is not None:
            if spec.prenorm:
                self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.mixer = _resolve(spec.module)(cfg, layer, shared)
        self.ffn: nn.Module | None = None
        self.ffn_norm: nn.Module | None = None
        ffn = FFN_KINDS[cfg.ffn_types[layer]]
        if ffn is not None:
            self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.ffn = _resolve(ffn)(cfg, layer)


class HybridModel(nn.Module):
    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # Weights that several layers use (a kind's mixers may create and share them here);
        # empty for most families, so it adds no parameter names.
        self.shared = nn.ModuleDict()
        self.layers = nn.ModuleList(Block(cfg, i, self.shared) for i in range(cfg.num_layers))
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
        bias = attention_bias(attention_mask, l) if cfg.has_attention else None
        ctx = MixerContext(attention_mask[:, attention_mask.shape[1] - l :], bias, cos, sin, x)
        out: list[torch.Tensor] = []
        i = 0
        for layer in self.model.layers:
            block = cast(Block, layer)
            if block.mixer is not None:
                hin = block.input_norm(x) if block.input_norm is not None else x
                h, *present = block.mixer(hin, ctx, *states[i : i + block.n_states])
                out += present
                i += block.n_states
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
