"""Trace a model one piece at a time: the outer graph (embedding, call context, final norm, LM
head) and one template per distinct layer, each with its weights as graph inputs.

A 40-layer model has two or three distinct layers (a Mamba2 block, an attention block, the
first block, which has no pending residual), so tracing them once each and instantiating the
template for every layer (compose.py) keeps export time and memory independent of depth. The
first block is not traced where a later block has its signature: its template is the later
one's without the residual's Add (templates.first_layer). The
weights are inputs of the templates, not initializers: the traced graphs hold no weight
values, every transform of a weight (the transpose of a Linear, -exp(A_log), a repeat for
grouped heads) stays a node that compose.py evaluates per layer on that layer's own tensors.

Modules are built without initializing their parameters (`skip_init`): a parameter is an
untouched torch.empty, address space rather than memory, and tracing never reads it.

Template IO (compose.py maps it to each layer's names):
  layer  inputs  x, r (the stream and the previous block's output not yet added; no r in
                 layer 0), ctx.embeds, ctx.<field> (the MixerContext), state.<k>, w:<weight>
         outputs x.out, r.out, present.<k>
  outer  inputs  input_ids, [past_lengths,] logit_positions, x.last, r.last, w:<weight>
         outputs logits, x.first, ctx.<field>
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import onnx
import torch
from torch import nn

from ..config import HybridConfig
from ..graphs.contract import GraphContract
from ..models.context import MixerContext
from ..models.decoder import Block, HybridForCausalLM
from ..models.state import random_states
from .trace import EXAMPLE_BATCH, EXAMPLE_PASTS, EXAMPLE_SEQ, EXAMPLE_SPARE

# The context fields a layer may read, in a fixed order (ctx.embeds is the outer's x.first).
CTX_FIELDS = ("past_lengths", "cos", "sin", "rope_cos", "rope_sin", "seqlens_k", "total", "query_seqlens")
WEIGHT = "w:"
STREAM_DIMS = ("batch", "seq")  # x and r: [batch, seq, hidden]
TRACE_CACHE_ENV = "HYBRIDRT_TRACE_CACHE"  # a directory of templates shared between exports (trace_cache.py)
_CTX_DIMS: dict[str, tuple[str, ...]] = {
    "past_lengths": ("batch",),
    "cos": ("batch", "seq"),
    "sin": ("batch", "seq"),
    "seqlens_k": ("batch",),
    "query_seqlens": ("batch",),
}


@contextlib.contextmanager
def skip_init() -> Iterator[None]:
    """Build modules without initializing their parameters: torch.nn.init's fills and each
    module's reset_parameters do nothing. Buffers computed from the config (rotary tables)
    are computed as usual."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(nn.init, n) for n in names}
    modules = [m for m in vars(nn).values() if isinstance(m, type) and hasattr(m, "reset_parameters")]
    resets = {m: m.reset_parameters for m in modules}  # type: ignore[attr-defined]
    try:
        for n in names:
            setattr(nn.init, n, lambda t, *a, **k: t)
        for m in modules:
            m.reset_parameters = lambda self: None  # type: ignore[attr-defined]
        yield
    finally:
        for n, f in saved.items():
            setattr(nn.init, n, f)
        for m, f in resets.items():
            m.reset_parameters = f  # type: ignore[attr-defined]


class OuterLM(HybridForCausalLM):
    """The model around its layers: forward(input_ids, past_lengths, logit_positions, x_last,
    r_last) -> (logits, x_first, *context fields). Built whole (so that everything decided
    from the whole model, such as keeping rotary tables, is decided alike), then its layers
    are dropped."""

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        past_lengths: torch.Tensor,
        logit_positions: torch.Tensor,
        x_last: torch.Tensor,
        r_last: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        x, ctx = self.embed(input_ids, past_lengths)
        logits = self.head(x_last, r_last, logit_positions)
        return (logits, x, *flatten_ctx(ctx).values())


def outer_model(cfg: HybridConfig) -> OuterLM:
    with skip_init():
        model = OuterLM(cfg)
    model.model.layers = nn.ModuleList()
    return model.eval()


class Holder(nn.Module):
    """Layer i and the shared modules under the model's own names (model.layers.{i}.*,
    model.shared.*), so parameter names and node scopes are those of the whole model."""

    def __init__(self, block: Block, index: int, shared: nn.ModuleDict) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({str(index): block})
        self.model.shared = shared
        self.index = index

    def forward(self, *args: Any) -> Any:
        return cast(nn.ModuleDict, self.model.layers)[str(self.index)](*args)


def layer_blocks(cfg: HybridConfig, layers: list[int]) -> tuple[dict[int, Block], nn.ModuleDict]:
    """Uninitialized blocks for `layers` and the shared modules they use. Every earlier layer
    is built and dropped, so layer-dependent construction (a shared module made by the first
    layer that needs it) happens as in the model."""
    shared = nn.ModuleDict()
    blocks: dict[int, Block] = {}
    with skip_init():
        for i in range(max(layers) + 1):
            block = Block(cfg, i, shared)
            if i in layers:
                blocks[i] = block.eval()
    return blocks, shared


def signature(
    cfg: HybridConfig,
    outer: OuterLM,
    i: int,
    block: Block,
    shared: nn.ModuleDict,
    contract: GraphContract | None = None,
) -> tuple[object, ...]:
    """What makes two layers one graph: kind, feed-forward, first or not, the shapes of the
    layer's own parameters, its modules' settings and which shared modules it calls."""
    own = tuple((n, tuple(p.shape), p.dtype) for n, p in block.named_parameters())
    kinds = (cfg.layer_types[i], cfg.ffn_types[i], i == 0)
    return (*kinds, own, _settings(block), _shared_calls(cfg, outer, i, block, shared, contract))


_SCALARS = (bool, int, float, str, type(None))


def _settings(block: Block) -> tuple[object, ...]:
    """The plain settings every submodule keeps (sizes, flags, epsilons): a mixer that
    behaves differently by layer without a different parameter shape differs here."""
    out = []
    for name, module in block.named_modules():
        for key, value in sorted(vars(module).items()):
            plain = isinstance(value, _SCALARS) or (
                isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value)
            )
            if plain and not key.startswith("_") and key != "training":
                out.append((name, key, value))
    return tuple(out)


def _shared_calls(
    cfg: HybridConfig, outer: OuterLM, i: int, block: Block, shared: nn.ModuleDict, contract: GraphContract | None
) -> tuple[str, ...]:
    """Names of the shared modules layer i calls, found by running it on meta tensors."""
    if not len(shared):
        return ()
    called: list[str] = []
    handles = [
        m.register_forward_pre_hook(lambda mod, args, name=name: called.append(name))
        for name, m in shared.named_modules()
        if name
    ]
    try:
        ctx, x, states = example_context(cfg, outer, i, contract)
        meta = {k: v.to("meta") for k, v in ctx.items()}
        probe = Holder(block, i, shared).to("meta")
        with torch.no_grad(), contextlib.suppress(Exception):
            probe(
                x.to("meta"),
                None if i == 0 else x.to("meta"),
                unflatten_ctx(meta, x.to("meta")),
                [s.to("meta") for s in states],
            )
    finally:
        for h in handles:
            h.remove()
    return tuple(sorted(set(called)))


@dataclass
class Template:
    """The graph of one distinct layer (index >= 0) or of the outer graph (index -1)."""

    index: int
    model: onnx.ModelProto
    weights: list[str]  # parameter names of the traced layer (the graph's w:<name> inputs)


def flatten_ctx(ctx: MixerContext) -> dict[str, torch.Tensor]:
    tables = ctx.rope_cache or (None, None)
    lengths = ctx.lengths or (None, None, None)
    values = (ctx.past_lengths, ctx.cos, ctx.sin, *tables, *lengths)
    return {k: v for k, v in zip(CTX_FIELDS, values) if v is not None}


def unflatten_ctx(fields: dict[str, torch.Tensor], embeds: torch.Tensor) -> MixerContext:
    tables = (fields["rope_cos"], fields["rope_sin"]) if "rope_cos" in fields else None
    lengths = (fields["seqlens_k"], fields["total"], fields["query_seqlens"]) if "seqlens_k" in fields else None
    return MixerContext(fields.get("past_lengths"), fields.get("cos"), fields.get("sin"), embeds, tables, lengths)


def weights_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by name, tied ones once: what a checkpoint holds."""
    out: dict[str, torch.Tensor] = dict(module.named_parameters())
    persistent = set(module.state_dict(keep_vars=True))
    out.update((n, b) for n, b in module.named_buffers() if n in persistent)
    return out


class _LayerTrace(nn.Module):
    def __init__(self, holder: Holder, ctx: list[str], names: list[str], n_states: int) -> None:
        super().__init__()
        self.holder = holder  # a submodule for its scope names; its weights come as inputs
        self.ctx, self.names, self.first, self.n_states = ctx, names, holder.index == 0, n_states

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rest = list(args)
        x = rest.pop(0)
        r = None if self.first else rest.pop(0)
        embeds = rest.pop(0)
        fields = {k: rest.pop(0) for k in self.ctx}
        states = [rest.pop(0) for _ in range(self.n_states)]
        weights = dict(zip(self.names, rest))
        call = (x, r, unflatten_ctx(fields, embeds), states)
        x, r, present = torch.func.functional_call(self.holder, weights, call, strict=False)
        return (x, r, *present)


class _OuterTrace(nn.Module):
    def __init__(self, outer: OuterLM, names: list[str]) -> None:
        super().__init__()
        self.outer = outer
        self.names = names
        self.has_lengths = outer.config.has_attention

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        input_ids, *rest = args
        past_lengths = rest.pop(0) if self.has_lengths else torch.zeros_like(input_ids[:, 0])
        logit_positions, x_last, r_last = rest[:3]
        weights = dict(zip(self.names, rest[3:]))
        call = (input_ids, past_lengths, logit_positions, x_last, r_last)
        return cast(tuple[torch.Tensor, ...], torch.func.functional_call(self.outer, weights, call, strict=False))


def _export(
    module: nn.Module,
    args: list[torch.Tensor],
    dims: list[tuple[str | None, ...]],
    names: tuple[list[str], list[str]],
    fused: bool,
    root: str,
) -> onnx.ModelProto:
    from .onnx_export import _name_nodes, export_program, program_to_onnx

    dyn = tuple({j: torch.export.Dim.DYNAMIC for j, d in enumerate(ds) if d is not None} for ds in dims)
    with torch.no_grad():
        program = export_program(module, tuple(args), (dyn,), fused)
    model = program_to_onnx(program, names[0], names[1])
    _name_nodes(model, root)
    inputs = {v.name: v for v in model.graph.input}
    for name, ds in zip(names[0], dims):
        if name in inputs:
            for dim, want in zip(inputs[name].type.tensor_type.shape.dim, ds):
                if want is not None:
                    dim.Clear()
                    dim.dim_param = want
    return model


def example_context(
    cfg: HybridConfig, outer: HybridForCausalLM, layer: int, contract: GraphContract | None = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """Example context fields, stream and layer `layer`'s states at trace.py's example sizes."""
    g = torch.Generator().manual_seed(0)
    b, l = EXAMPLE_BATCH, EXAMPLE_SEQ
    pasts = torch.tensor(EXAMPLE_PASTS, dtype=torch.long)
    capacity = int(pasts.max()) + l + EXAMPLE_SPARE
    with torch.no_grad():
        _, ctx = outer.embed(torch.zeros(b, l, dtype=torch.long), pasts)
    x = torch.randn(b, l, cfg.hidden_size, generator=g)
    states = random_states(contract or GraphContract.of(cfg), b, capacity, g, layer)
    return flatten_ctx(ctx), x, states


def trace_layer(
    cfg: HybridConfig,
    outer: OuterLM,
    i: int,
    block: Block,
    shared: nn.ModuleDict,
    fused: bool,
    contract: GraphContract | None = None,
) -> Template:
    holder = Holder(block, i, shared)
    own = weights_of(holder)
    names = list(own)
    contract = contract or GraphContract.of(cfg)
    fields, x, states = example_context(cfg, outer, i, contract)
    ctx_names = [k for k in CTX_FIELDS if k in fields]
    specs = contract.layer_pasts(i)
    first = i == 0
    args = [x] + ([] if first else [torch.randn_like(x)]) + [x.clone()] + [fields[k] for k in ctx_names] + states
    args += [torch.empty(t.shape, dtype=t.dtype) for t in own.values()]
    stream: tuple[str | None, ...] = STREAM_DIMS
    dims: list[tuple[str | None, ...]] = [stream] * (2 if first else 3)
    dims += [_CTX_DIMS.get(k, ()) for k in ctx_names]
    dims += [tuple(d if isinstance(d, str) else None for d in s.dims) for s in specs]
    dims += [() for _ in names]
    in_names = ["x"] + ([] if first else ["r"]) + ["ctx.embeds"] + [f"ctx.{k}" for k in ctx_names]
    in_names += [f"state.{k}" for k in range(len(states))] + [WEIGHT + n for n in names]
    out_names = ["x.out", "r.out"] + [f"present.{k}" for k in range(len(states))]
    trace = _LayerTrace(holder, ctx_names, names, len(states))
    return Template(i, _export(trace, args, dims, (in_names, out_names), fused, "holder."), names)


def trace_outer(cfg: HybridConfig, outer: OuterLM, fused: bool, contract: GraphContract | None = None) -> Template:
    own = weights_of(outer)
    names = list(own)
    contract = contract or GraphContract.of(cfg)
    fields, x, _ = example_context(cfg, outer, 0, contract)
    specs = contract.head_inputs
    g = torch.Generator().manual_seed(1)
    b, l = x.shape[:2]
    base: list[torch.Tensor] = [torch.randint(0, cfg.vocab_size, (b, l), generator=g)]
    if cfg.has_attention:
        base.append(torch.tensor(EXAMPLE_PASTS, dtype=torch.long))
    base.append(torch.arange(l))
    args = base + [x, torch.randn_like(x)] + [torch.empty(t.shape, dtype=t.dtype) for t in own.values()]
    dims: list[tuple[str | None, ...]] = [tuple(d if isinstance(d, str) else None for d in s.dims) for s in specs]
    dims += [STREAM_DIMS, STREAM_DIMS] + [() for _ in names]
    in_names = [s.name for s in specs] + ["x.last", "r.last"] + [WEIGHT + n for n in names]
    out_names = ["logits", "x.first"] + [f"ctx.{k}" for k in CTX_FIELDS if k in fields]
    trace = _OuterTrace(outer, names)
    return Template(-1, _export(trace, args, dims, (in_names, out_names), fused, "outer."), names)
