"""Zero states for a fresh sequence, shaped by the graph contract."""

from __future__ import annotations

import torch

from ..config import HybridConfig
from ..graphs.contract import past_specs
from ..graphs.feeds import state_shape


def zero_states(cfg: HybridConfig, batch: int, capacity: int) -> list[torch.Tensor]:
    """Past tensors for `batch` fresh sequences: zero SSM/conv states, zero KV buffers of
    `capacity` positions."""
    return [torch.zeros(state_shape(spec, batch, capacity)) for spec in past_specs(cfg)]
