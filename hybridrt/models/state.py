"""Zero states for a fresh sequence, shaped by the graph contract."""

from __future__ import annotations

import torch

from ..config import HybridConfig
from ..graphs.contract import past_specs
from ..graphs.feeds import state_shape


def zero_states(cfg: HybridConfig, batch: int, past_len: int = 0) -> list[torch.Tensor]:
    """Past tensors for `batch` fresh sequences (KV of length `past_len`, zero SSM/conv)."""
    return [torch.zeros(state_shape(spec, batch, past_len)) for spec in past_specs(cfg)]
