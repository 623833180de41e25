"""States for the graph contract's pasts, in its order: zeros for a fresh sequence, or random
values (export's tracing and parity check feed rows that have seen earlier tokens)."""

from __future__ import annotations

import torch

from ..config import HybridConfig
from ..graphs.contract import GraphContract
from ..graphs.feeds import state_shape


def zero_tensors(cfg: HybridConfig | GraphContract, batch: int, capacity: int) -> list[torch.Tensor]:
    """Past tensors for `batch` fresh sequences: zero SSM/conv states, zero KV buffers of
    `capacity` positions. Takes the contract, or a config to build it from."""
    contract = cfg if isinstance(cfg, GraphContract) else GraphContract.of(cfg)
    return [torch.zeros(state_shape(spec, batch, capacity)) for spec in contract.pasts]


def random_states(
    contract: GraphContract, batch: int, capacity: int, generator: torch.Generator, layer: int | None = None
) -> list[torch.Tensor]:
    """Standard-normal pasts (of layer `layer` alone when given), drawn from `generator` in
    contract order."""
    specs = contract.pasts if layer is None else contract.layer_pasts(layer)
    return [torch.randn(state_shape(spec, batch, capacity), generator=generator) for spec in specs]
