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
# baked in for the other. So no size can be baked in by accident.
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST = 2, 37, 3


class GraphModule(nn.Module):
    """forward(input_ids, attention_mask, [position_ids,] *pasts) -> (logits, *presents)."""

    def __init__(self, model: HybridForCausalLM) -> None:
        super().__init__()
        self.model = model
        self.uses_positions = model.config.uses_positions

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *rest: torch.Tensor):  # type: ignore[no-untyped-def]
        position_ids = rest[0] if self.uses_positions else None
        states = list(rest[1:] if self.uses_positions else rest)
        logits, out = self.model(input_ids, attention_mask, position_ids, states)
        return (logits, *out)


def feeds(
    model: HybridForCausalLM, ids: torch.Tensor, mask: torch.Tensor, states: list[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Positional inputs of GraphModule, in contract order, as graphs.feeds builds them."""
    specs = input_specs(model.config)
    pasts = {s.name: x for s, x in zip(past_specs(model.config), states)}
    named = graph_feeds(specs, ids.numpy(), mask.long().numpy(), pasts)
    return tuple(torch.as_tensor(named[s.name]) for s in specs)


def example_inputs(model: HybridForCausalLM, seq: int = EXAMPLE_SEQ) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    b, l, p = EXAMPLE_BATCH, seq, EXAMPLE_PAST
    has_kv = model.config.has_attention
    p = p if has_kv else 0
    ids = torch.randint(0, model.config.vocab_size, (b, l), generator=g)
    mask = torch.ones(b, p + l, dtype=torch.long)
    states = [s.normal_(generator=g) for s in zero_states(model.config, b, p)]
    return feeds(model, ids, mask, states)


def dynamic_shapes(model: HybridForCausalLM) -> tuple[object, ...]:
    """torch.export dynamic shapes, structured as GraphModule's (ids, mask, *rest) signature.

    Dim.DYNAMIC lets torch.export derive total_len = past_len + seq itself; the ONNX dims are
    renamed to the contract's symbolic names afterwards.
    """
    dyn = torch.export.Dim.DYNAMIC
    specs = input_specs(model.config)
    shapes = [{i: dyn for i, d in enumerate(s.dims) if isinstance(d, str)} for s in specs]
    return (shapes[0], shapes[1], tuple(shapes[2:]))
