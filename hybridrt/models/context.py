"""What every mixer receives beside its input and its states (one call signature for all kinds)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class MixerContext(NamedTuple):
    """Per-call inputs shared by the layers of one forward. A call feeds the same number of
    new tokens to every row (no padding inside a call), so recurrent mixers need no mask.

    past_lengths [b]        tokens each row's states have seen (None when no layer attends):
                            attention writes its new KV there and reads everything before
    cos/sin      [b, l, rd] rotary tables of this call's positions (None when the model
                            uses no positions)
    embeds       [b, l, d]  the (scaled) input embeddings, for kinds that re-read them
    rope_cache   ([max_len, rd/2] cos, sin) of every position, when the model keeps them:
                            fused attention then rotates inside its operator
    lengths      (seqlens_k [b], total [], query_seqlens [b]) int32: what every attention
                            layer's GroupQueryAttention reads, computed once per call
    """

    past_lengths: torch.Tensor | None
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    embeds: torch.Tensor
    rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None
    lengths: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
