"""Zero states for a fresh sequence, shaped by the graph contract."""

from __future__ import annotations

import torch

from ..graphs.contract import past_specs
from .config import HybridConfig


def zero_states(cfg: HybridConfig, batch: int, past_len: int = 0) -> list[torch.Tensor]:
    """Past tensors for `batch` fresh sequences (KV of length `past_len`, zero SSM/conv)."""
    out = []
    for spec in past_specs(cfg):
        dims = [batch if d == "batch" else past_len if d == "past_len" else d for d in spec.dims]
        out.append(torch.zeros([int(d) for d in dims]))
    return out
