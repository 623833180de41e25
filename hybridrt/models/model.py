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
from .layers import RMSNorm, rope_cos_sin, rope_inv_freq
from .ops import attention_lengths
from .state import zero_states


def _resolve(path: str) -> type[nn.Module]:
    """ "package.module:Class" from the kinds table -> the class."""
    module, _, name = path.partition(":")
    return cast(type[nn.Module], getattr(importlib.import_module(module), name))


# Rotary tables up to this many values (positions x rotary dims, cos and sin alike) are
# always kept; larger ones only while they stay under 1% of the parameters.
ROPE_TABLE_MIN = 1 << 20


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
    """input_ids [b, l], past_lengths [b], logit_positions [n], states -> logits [b, n, v], states'.

    The graph contract's signature (hybridrt.graphs.contract). For direct use the last three
    may be left out: a fresh sequence (zero states, KV buffers of exactly l positions) and
    logits for every position.
    """

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = HybridModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq: torch.Tensor | None
        self.rope_cos: torch.Tensor | None
        self.rope_sin: torch.Tensor | None
        self.register_buffer("rope_cos", None, persistent=False)
        self.register_buffer("rope_sin", None, persistent=False)
        if cfg.uses_positions:
            self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
            # cos/sin of every position, for attention that rotates inside its fused operator;
            # left out where they would outweigh a small model (then q and k rotate before it).
            n_params = sum(p.numel() for p in self.parameters())
            if cfg.max_position_embeddings * cfg.rotary_dim <= max(ROPE_TABLE_MIN, n_params // 100):
                freqs = torch.arange(cfg.max_position_embeddings).float().unsqueeze(1) * self.inv_freq
                self.register_buffer("rope_cos", freqs.cos(), persistent=False)
                self.register_buffer("rope_sin", freqs.sin(), persistent=False)
        else:
            self.inv_freq = None

    def forward(
        self,
        input_ids: torch.Tensor,
        past_lengths: torch.Tensor | None = None,
        logit_positions: torch.Tensor | None = None,
        states: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, l = input_ids.shape
        cfg = self.config
        if states is None:
            states = zero_states(cfg, b, l)
        if past_lengths is None:
            past_lengths = torch.zeros(b, dtype=torch.long)
        x = self.model.embed_tokens(input_ids)
        if cfg.embedding_multiplier != 1.0:
            x = x * cfg.embedding_multiplier
        cos = sin = None
        if self.inv_freq is not None and cfg.has_attention:
            positions = past_lengths.unsqueeze(1) + torch.arange(l, device=input_ids.device)  # [b, l]
            cos, sin = rope_cos_sin(self.inv_freq, positions)
        tables = (self.rope_cos, self.rope_sin) if self.rope_cos is not None and self.rope_sin is not None else None
        lengths = attention_lengths(past_lengths, l) if cfg.has_attention else None
        ctx = MixerContext(past_lengths if cfg.has_attention else None, cos, sin, x, tables, lengths)
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
        x = self.model.norm(x)  # before the selection, so the final residual Add fuses into it
        if logit_positions is not None:
            x = x.index_select(1, logit_positions)  # only these positions reach the LM head
        logits = self.lm_head(x)
        if cfg.logits_scaling != 1.0:
            logits = logits / cfg.logits_scaling
        return logits, out

    def _residual(self, h: torch.Tensor) -> torch.Tensor:
        m = self.config.residual_multiplier
        return h if m == 1.0 else h * m
