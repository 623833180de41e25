"""What every mixer receives beside its input and its states (one call signature for all kinds)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class MixerContext(NamedTuple):
    """Per-call inputs shared by the layers of one forward.

    mask    [b, l]          1 = token, 0 = left padding (this call's positions): recurrent
                            mixers must leave their state untouched at padding
    bias    [b, 1, l, p+l]  additive attention mask (None when no layer attends)
    cos/sin [b, l, rd]      rotary tables (None when the model uses no positions)
    embeds  [b, l, d]       the (scaled) input embeddings, for kinds that re-read them
    """

    mask: torch.Tensor
    bias: torch.Tensor | None
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    embeds: torch.Tensor
