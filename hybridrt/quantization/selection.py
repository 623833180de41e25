"""Which nodes get quantized weights, and why every other candidate stays float.

Every mode quantizes MatMul nodes with a constant weight (the linear layers), the
mixture-of-experts nodes' experts (quantization.moe: QMoE, 4 bits in int4, 8 otherwise) and the
vocabulary matrices: the embedding Gather (/model/embed_tokens/Gather) and the LM head
(/lm_head/MatMul), which vocab.quantize_vocab stores block-wise in every mode (one tensor when they are
tied). All other operators stay float because no mode lists them. Node names are
hierarchical (/model/layers.{i}/{mixer,ffn,input_norm,ffn_norm}/..., /model/norm/...), so
the exclusions are fnmatch patterns over them.

Two rules always hold (no option overrides them):
- state tensors are never quantized: a node that reads a past.* input or writes a
  present.* output stays float, so the recurrent SSM/conv states and the KV cache keep
  full precision from one step to the next (quantization error there compounds per token);
- a MatMul without a constant weight (activation x activation: attention scores and
  values over the KV cache) stays float.

DEFAULT_KEEP_FLOAT lists the rest, with the `keep_float` rules each layer kind declares in
`hybridrt.kinds` (applied to the layers of that kind only; drop all of them with
keep_float_default=False; --include PATTERN quantizes matching nodes anyway, --exclude
PATTERN keeps more float).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from ..kinds import LAYER_KINDS
from .modes import QUANTIZED_OP_TYPES, QuantConfig
from .moe import expert_block, moe_nodes
from .rewrites import constant_weights
from .vocab import VocabNodes, find_vocab_nodes


@dataclass(frozen=True)
class KeepFloat:
    pattern: str
    why: str


DEFAULT_KEEP_FLOAT: tuple[KeepFloat, ...] = (
    KeepFloat("*/LinearAttention*", "the SSM recurrence S_t = exp(g_t) S_t-1 + k_t v_t: its error compounds per token"),
    KeepFloat("*/Softplus*", "dt = softplus(.) sets the decay exp(dt A); small errors change how long state lasts"),
    KeepFloat("*/Exp*", "exp(dt A), the per-token decay of the SSM state"),
    KeepFloat("*norm*", "RMSNorm (Pow/ReduceMean/Sqrt) and the dt/B/C norms: reductions that scale every channel"),
    KeepFloat("*/mixer/Conv*", "the causal conv runs over [conv state, x]: the conv state path"),
    KeepFloat("*/ffn/router/*", "the MoE router: a flipped top-k sends tokens to other experts; it is tiny"),
)


# int8-static only: MatMuls whose weights are quantized (8-bit blocks, MatMulNBits) but whose
# input activation stays float, because a per-tensor int8 activation loses too much of it.
# Found with onnxruntime's qdq_loss_debug on the default model: these inputs are products
# of a gate and a signal, heavy-tailed, and quantizing them alone leaves 13-23 dB SQNR
# where the normed inputs keep 38-40 dB and attention outputs 34 dB; quantized statically,
# they carried most of int8-static's loss (mean KL 7.0e-3; with them float, 5.2e-4).
DEFAULT_FLOAT_ACTIVATIONS: tuple[KeepFloat, ...] = (
    KeepFloat("*/mixer/out_proj/*", "reads y * silu(z), the gated SSM output (15-21 dB SQNR as int8)"),
    KeepFloat("*/ffn/down_proj/*", "reads silu(gate) * up (13-23 dB SQNR as int8)"),
)


@dataclass
class NodeSelection:
    """Node names to quantize, and every candidate kept float with the reason.

    `quantize` goes to the mode's quantizer (linear layers); `vocab` lists the chosen
    vocabulary nodes (embedding Gather, LM head), which vocab.quantize_vocab quantizes in
    every mode."""

    quantize: list[str]
    excluded: dict[str, str]
    patterns: list[str]
    vocab: list[str] = field(default_factory=list)
    vocab_nodes: VocabNodes | None = None
    float_activations: dict[str, str] = field(default_factory=dict)

    @property
    def static(self) -> list[str]:
        """int8-static: the nodes that get QDQ (int8 activations and weights)."""
        return [n for n in self.quantize if n not in self.float_activations]


def kind_rules(layer_types: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    """Each layer kind's keep-float rules (hybridrt.kinds), anchored at the layers of that kind."""
    rules = []
    for i, name in enumerate(layer_types):
        kind = LAYER_KINDS.get(name)
        for pattern, why in kind.keep_float if kind is not None else ():
            rules.append((f"/model/layers.{i}/{pattern}", f"{name} layer: {why}"))
    return rules


def select_nodes(graph: Any, cfg: QuantConfig, layer_types: list[str] | tuple[str, ...] = ()) -> NodeSelection:
    """Apply the state rules, the default list and the kinds' rules (unless disabled),
    --exclude and --include."""
    defaults = (
        [(k.pattern, k.why) for k in DEFAULT_KEEP_FLOAT] + kind_rules(layer_types) if cfg.keep_float_default else []
    )
    patterns = defaults + [(p, "--exclude") for p in cfg.exclude]
    weights = constant_weights(graph) | {name: (fc1, False) for name, (fc1, _) in moe_nodes(graph).items()}
    vocab_nodes = find_vocab_nodes(graph)
    chosen: list[str] = []
    excluded: dict[str, str] = {}
    for node in graph.node:
        if node.op_type not in (*QUANTIZED_OP_TYPES, "MoE") and node.name not in vocab_nodes.names:
            continue
        if any(n.startswith("past.") for n in node.input) or any(n.startswith("present.") for n in node.output):
            excluded[node.name] = "reads or writes a state tensor"
        elif node.name not in weights and node.name != vocab_nodes.gather:
            excluded[node.name] = "no constant weight (activation x activation, e.g. attention over the KV cache)"
        elif node.op_type == "MoE" and expert_block(graph, node.name, cfg.block_size) is None:
            excluded[node.name] = "no block size of 16 or more divides the hidden size and the experts' width"
        elif any(fnmatchcase(node.name, p) for p in cfg.include):
            chosen.append(node.name)
        else:
            why = next((f"{p}: {w}" for p, w in patterns if fnmatchcase(node.name, p)), None)
            if why is None:
                chosen.append(node.name)
            else:
                excluded[node.name] = why
    vocab = [n for n in chosen if n in vocab_nodes.names]
    quantize = [n for n in chosen if n not in vocab_nodes.names]
    float_activations: dict[str, str] = {}
    if cfg.mode == "int8-static":
        rules = (
            [(k.pattern, k.why) for k in DEFAULT_FLOAT_ACTIVATIONS]
            if cfg.float_activations is None
            else [(p, "--float-activations") for p in cfg.float_activations]
        )
        for name in quantize:
            why = next((f"{p}: {w}" for p, w in rules if fnmatchcase(name, p)), None)
            if why is not None:
                float_activations[name] = why
    return NodeSelection(quantize, excluded, [p for p, _ in patterns], vocab, vocab_nodes, float_activations)
