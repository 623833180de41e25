"""The traceable form of the reference model: flat tensors in, flat tensors out, in
graph-contract order, plus example inputs and dynamic-shape declarations."""

from __future__ import annotations

import torch
from torch import nn

from ..graphs.contract import input_specs, past_specs
from ..graphs.feeds import graph_feeds
from ..models.model import HybridForCausalLM
from ..models.state import zero_states

# Example sizes for tracing. None is 0 or 1 (torch.export would specialize on them), the
# sequence is not a multiple of the scan chunk, and it spans several chunks: at one chunk,
# sizes such as chunks + 1 and 2 * chunks coincide and the plain-op Mamba2 scan got one
# baked in for the other. So no size can be baked in by accident. Rows have different past
# lengths, and the KV capacity is larger than any row needs.
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PASTS, EXAMPLE_SPARE = 2, 37, (3, 5), 6


class GraphModule(nn.Module):
    """forward(input_ids, [past_lengths,] logit_positions, *pasts) -> (logits, *presents)."""

    def __init__(self, model: HybridForCausalLM) -> None:
        super().__init__()
        self.model = model
        self.has_lengths = model.config.has_attention

    def forward(self, input_ids: torch.Tensor, *rest: torch.Tensor):  # type: ignore[no-untyped-def]
        past_lengths = rest[0] if self.has_lengths else None
        logit_positions, *states = rest[1:] if self.has_lengths else rest
        logits, out = self.model(input_ids, past_lengths, logit_positions, list(states))
        return (logits, *out)


def feeds(
    model: HybridForCausalLM,
    ids: torch.Tensor,
    past_lengths: torch.Tensor | int,
    states: list[torch.Tensor],
    all_logits: bool = True,
) -> tuple[torch.Tensor, ...]:
    """Positional inputs of GraphModule, in contract order, as graphs.feeds builds them."""
    specs = input_specs(model.config)
    pasts = {s.name: x for s, x in zip(past_specs(model.config), states)}
    lengths = past_lengths.numpy() if isinstance(past_lengths, torch.Tensor) else past_lengths
    named = graph_feeds(specs, ids.numpy(), lengths, pasts, all_logits)
    return tuple(torch.as_tensor(named[s.name]) for s in specs)


def example_inputs(model: HybridForCausalLM, seq: int = EXAMPLE_SEQ) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    b, l = EXAMPLE_BATCH, seq
    pasts = torch.tensor(EXAMPLE_PASTS, dtype=torch.long)
    capacity = int(pasts.max()) + l + EXAMPLE_SPARE
    ids = torch.randint(0, model.config.vocab_size, (b, l), generator=g)
    states = [s.normal_(generator=g) for s in zero_states(model.config, b, capacity)]
    return feeds(model, ids, pasts, states)


def dynamic_shapes(model: HybridForCausalLM) -> tuple[object, ...]:
    """torch.export dynamic shapes, structured as GraphModule's (ids, *rest) signature; the
    ONNX dims are renamed to the contract's symbolic names afterwards."""
    dyn = torch.export.Dim.DYNAMIC
    specs = input_specs(model.config)
    shapes = [{i: dyn for i, d in enumerate(s.dims) if isinstance(d, str)} for s in specs]
    return (shapes[0], tuple(shapes[1:]))
