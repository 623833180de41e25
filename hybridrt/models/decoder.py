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

from ..config import HybridConfig, Multipliers
from ..ffn_kinds import FFN_KINDS
from ..kinds import layer_kind
from .context import MixerContext
from .layers import RMSNorm, rope_cos_sin, rope_inv_freq
from .ops import attention_lengths
from .state import zero_tensors


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
        ffn = FFN_KINDS[cfg.ffn_types[layer]].module
        if ffn is not None:
            cls = _resolve(ffn)
            # A feed-forward class with `prenorm = False` norms its own output instead (OLMo).
            if getattr(cls, "prenorm", True):
                self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.ffn = cls(cfg, layer)
        self.residual_multiplier = cfg.params(Multipliers).residual_multiplier

    def forward(
        self, x: torch.Tensor, r: torch.Tensor | None, ctx: MixerContext, states: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """x [b, l, d] the residual stream, r [b, l, d] the previous block's output not yet added
        to it (None before the first block) -> (x, r, presents).

        The last addition of each block is left to the next one (and to the LM head's norm), so
        that each residual Add sits in front of the norm that reads it: that is the pair
        onnxruntime fuses into one SkipSimplifiedLayerNormalization, and it keeps a block's
        graph whole, from its input Add to its output, for export one block at a time."""
        if r is not None:
            x, r = x + r, None
        present: list[torch.Tensor] = []
        if self.mixer is not None:
            hin = self.input_norm(x) if self.input_norm is not None else x
            h, *present = self.mixer(hin, ctx, *states)
            r = self._residual(h)
        if self.ffn is not None:
            if r is not None:
                x = x + r
            r = self._residual(self.ffn(self.ffn_norm(x) if self.ffn_norm is not None else x))
        assert r is not None, "a layer has a mixer, a feed-forward or both"
        return x, r, present

    def _residual(self, h: torch.Tensor) -> torch.Tensor:
        m = self.residual_multiplier
        return h if m == 1.0 else h * m


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
        if states is None:
            states = zero_tensors(self.config, b, l)
        if past_lengths is None:
            past_lengths = torch.zeros(b, dtype=torch.long)
        x, ctx = self.embed(input_ids, past_lengths)
        r: torch.Tensor | None = None
        out: list[torch.Tensor] = []
        i = 0
        for layer in self.model.layers:
            block = cast(Block, layer)
            x, r, present = block(x, r, ctx, states[i : i + block.n_states])
            out += present
            i += block.n_states
        assert r is not None
        return self.head(x, r, logit_positions), out

    def embed(self, input_ids: torch.Tensor, past_lengths: torch.Tensor) -> tuple[torch.Tensor, MixerContext]:
        """input_ids [b, l], past_lengths [b] -> the scaled embeddings x [b, l, d] and the
        context every layer of this call reads."""
        l = input_ids.shape[1]
        cfg = self.config
        x = self.model.embed_tokens(input_ids)
        scale = cfg.params(Multipliers).embedding_multiplier
        if scale != 1.0:
            x = x * scale
        cos = sin = None
        if self.inv_freq is not None and cfg.has_attention:
            positions = past_lengths.unsqueeze(1) + torch.arange(l, device=input_ids.device)  # [b, l]
            cos, sin = rope_cos_sin(self.inv_freq, positions)
        tables = (self.rope_cos, self.rope_sin) if self.rope_cos is not None and self.rope_sin is not None else None
        lengths = attention_lengths(past_lengths, l) if cfg.has_attention else None
        return x, MixerContext(past_lengths if cfg.has_attention else None, cos, sin, x, tables, lengths)

    def head(self, x: torch.Tensor, r: torch.Tensor, logit_positions: torch.Tensor | None) -> torch.Tensor:
        """The residual stream x and the last block's output r [b, l, d] -> logits [b, n, v] at
        logit_positions (every position when None)."""
        x = self.model.norm(x + r)  # before the selection, so the final residual Add fuses into it
        if logit_positions is not None:
            x = x.index_select(1, logit_positions)  # only these positions reach the LM head
        logits = self.lm_head(x)
        scaling = self.config.params(Multipliers).logits_scaling
        if scaling != 1.0:
            logits = logits / scaling
        return logits
