"""The traceable form of the reference model: flat tensors in, flat tensors out, in
graph-contract order, plus example inputs and dynamic-shape declarations."""

from __future__ import annotations

import torch
from torch import nn

from ..graphs.contract import GraphContract
from ..graphs.feeds import graph_feeds
from ..models.decoder import HybridForCausalLM
from ..models.state import random_states

# Example sizes for tracing. None is 0 or 1 (torch.export would specialize on them), the
# sequence is not a multiple of the scan chunk, and it spans several chunks: at one chunk,
# sizes such as chunks + 1 and 2 * chunks coincide and the plain-op Mamba2 scan got one
# baked in for the other. So no size can be baked in by accident. Rows have different past
# lengths, and the KV capacity is larger than any row needs.
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PASTS, EXAMPLE_SPARE = 2, 37, (3, 5), 6


class GraphModule(nn.Module):
    """forward(input_ids, [past_lengths,] logit_positions, *pasts) -> (logits, *presents).

    `contract` is the model's graph contract, built once per export and passed down (built
    from the config when not given)."""

    def __init__(self, model: HybridForCausalLM, contract: GraphContract | None = None) -> None:
        super().__init__()
        self.model = model
        self.contract = contract if contract is not None else GraphContract.of(model.config)
        self.has_lengths = self.contract.takes_lengths

    def forward(self, input_ids: torch.Tensor, *rest: torch.Tensor):  # type: ignore[no-untyped-def]
        past_lengths = rest[0] if self.has_lengths else None
        logit_positions, *states = rest[1:] if self.has_lengths else rest
        logits, out = self.model(input_ids, past_lengths, logit_positions, list(states))
        return (logits, *out)


def feeds(
    contract: GraphContract,
    ids: torch.Tensor,
    past_lengths: torch.Tensor | int,
    states: list[torch.Tensor],
    all_logits: bool = True,
) -> tuple[torch.Tensor, ...]:
    """Positional inputs of GraphModule, in contract order, as graphs.feeds builds them."""
    pasts = {s.name: x for s, x in zip(contract.pasts, states)}
    lengths = past_lengths.numpy() if isinstance(past_lengths, torch.Tensor) else past_lengths
    named = graph_feeds(contract.inputs, ids.numpy(), lengths, pasts, all_logits)
    return tuple(torch.as_tensor(named[s.name]) for s in contract.inputs)


def example_inputs(module: GraphModule, seq: int = EXAMPLE_SEQ) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    b, l = EXAMPLE_BATCH, seq
    pasts = torch.tensor(EXAMPLE_PASTS, dtype=torch.long)
    capacity = int(pasts.max()) + l + EXAMPLE_SPARE
    ids = torch.randint(0, module.model.config.vocab_size, (b, l), generator=g)
    return feeds(module.contract, ids, pasts, random_states(module.contract, b, capacity, g))


def dynamic_shapes(contract: GraphContract) -> tuple[object, ...]:
    """torch.export dynamic shapes, structured as GraphModule's (ids, *rest) signature; the
    ONNX dims are renamed to the contract's symbolic names afterwards."""
    dyn = torch.export.Dim.DYNAMIC
    specs = contract.inputs
    shapes = [{i: dyn for i, d in enumerate(s.dims) if isinstance(d, str)} for s in specs]
    return (shapes[0], tuple(shapes[1:]))
