"""The vocabulary matrices, block-quantized in every mode (`quantize_vocab`).

The vocabulary matrices are the embedding table (a Gather on input_ids) and the LM head (the
MatMul that writes the logits). In a small model they hold much of the weight: 15% of the
default model's and 20% of jamba-125m's parameters sit in one tied [vocab, hidden] table.
Every mode stores them as block-wise weights along the hidden dimension, never as QDQ: the
embedding becomes com.microsoft GatherBlockQuantized and the LM head MatMulNBits. The two
layouts agree byte for byte (MatMulNBits keeps B as [N = vocab, k_blocks, blob], rows of
the table), so a tied table is stored once and both nodes read the same initializer; only
the scales go through a Reshape to GatherBlockQuantized's rank ([vocab, k_blocks, 1]).
Quantization is symmetric round-to-nearest (onnxruntime's block quantizer), whose implicit
zero point 2^(bits-1) both operators share. They take 8 bits in every mode by default
(--vocab-bits 4 for the smallest int4 files): the LM head is the most sensitive matrix of
the model, and on the default model a 4-bit one tripled int4's mean KL divergence
(9.6e-3 vs 3.1e-3; size 0.179 vs 0.195 of the float graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import QuantizationError
from ..graphs.edit import graph_reads
from .methods import block_quantize
from .rewrites import constant_weights


@dataclass(frozen=True)
class VocabNodes:
    """The embedding Gather and its table, the LM head MatMul and its weight; `tied` when
    the head reads the table through a Transpose (lm_head = embedding^T)."""

    gather: str | None
    table: str | None
    head: str | None
    head_weight: str | None
    tied: bool

    @property
    def names(self) -> list[str]:
        return [n for n in (self.gather, self.head) if n is not None]


def find_vocab_nodes(graph: Any) -> VocabNodes:
    inits = {t.name: t for t in graph.initializer}
    gather = next(
        (
            n
            for n in graph.node
            if n.op_type == "Gather"
            and n.input[0] in inits
            and len(inits[n.input[0]].dims) == 2
            and n.input[1] == "input_ids"
        ),
        None,
    )
    table = gather.input[0] if gather is not None else None
    weights = constant_weights(graph)
    logits = {o.name for o in graph.output if o.name == "logits"}
    head, head_weight, tied = None, None, False
    for node in graph.node:
        # Our export names it /lm_head/MatMul; a scaled head (Granite's logits_scaling) does
        # not write the logits itself, a tied one reads the table through a Transpose.
        named = node.name.startswith("/lm_head/")
        if node.name in weights and (named or set(node.output) & logits or weights[node.name] == (table, True)):
            head, (head_weight, tied) = node.name, weights[node.name]
            tied = tied and head_weight == table
            break
    return VocabNodes(gather.name if gather is not None else None, table, head, head_weight, tied)


def vocab_block(hidden: int, wanted: int) -> int | None:
    """The largest power of two <= wanted (and >= 16) that divides `hidden`: the embedding's
    blocks must tile each row exactly for its output to reshape back to [.., hidden]."""
    block = wanted
    while block >= 16:
        if hidden % block == 0:
            return block
        block //= 2
    return None


@dataclass
class _VocabRewrite:
    """One quantize_vocab call: the settings, and the initializers it adds."""

    graph: Any
    bits: int
    block: int
    new_inits: list[Any]

    def quantized(self, matrix_vh: np.ndarray, prefix: str) -> tuple[str, str, int]:
        """[vocab, hidden] -> packed [vocab, k_blocks, blob] and scales [vocab, k_blocks]."""
        from onnx import numpy_helper

        packed, scales = block_quantize(matrix_vh, self.bits, self.block)
        data, scale_name = f"{prefix}.q{self.bits}", f"{prefix}.scales"
        self.new_inits += [numpy_helper.from_array(packed, data), numpy_helper.from_array(scales, scale_name)]
        return data, scale_name, int(packed.shape[1])


def quantize_vocab(
    graph: Any, nodes: VocabNodes, chosen: set[str], bits: int, wanted_block: int, accuracy_level: int
) -> dict[str, Any]:
    """Replace the chosen vocabulary nodes by their block-quantized forms, in place.

    Returns the record for the manifest: which nodes, bits, block size, whether one tensor
    serves both, and the bytes of the vocabulary weights before and after."""
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    do_gather = nodes.gather is not None and nodes.gather in chosen
    do_head = nodes.head is not None and nodes.head in chosen
    before = _bytes(inits, {nodes.table, nodes.head_weight} - {None})
    record: dict[str, Any] = {"embedding": None, "lm_head": None, "tied": nodes.tied, "bits": bits}
    if not (do_gather or do_head):
        return record | {"block_size": None, "parent_bytes": before, "bytes": before}
    table = numpy_helper.to_array(inits[nodes.table]) if nodes.table else None
    hidden = int(table.shape[1]) if table is not None else int(inits[nodes.head_weight].dims[0])  # type: ignore[index]
    block = vocab_block(hidden, wanted_block)
    if do_gather and block is None:
        raise QuantizationError(
            f"the embedding's hidden size {hidden} is not a multiple of 16, so it cannot be stored block-wise; "
            f"keep it float with --exclude '{nodes.gather}'"
        )
    rewrite = _VocabRewrite(graph, bits, block or wanted_block, [])
    shared = do_gather and do_head and nodes.tied
    table_data = None
    if do_gather:
        assert table is not None
        table_data = _quantize_embedding(rewrite, nodes, table)
        record["embedding"] = "GatherBlockQuantized"
    if do_head:
        _quantize_head(rewrite, nodes, inits, table, table_data if shared else None, accuracy_level)
        record["lm_head"] = "MatMulNBits"
    graph.initializer.extend(rewrite.new_inits)
    _drop_unused(graph)
    # The float table or head weight stays only where a float node still reads it.
    after = _bytes(
        {t.name: t for t in graph.initializer}, {t.name for t in rewrite.new_inits} | {nodes.table, nodes.head_weight}
    )
    return record | {"shared": shared, "block_size": rewrite.block, "parent_bytes": before, "bytes": after}


def _quantize_embedding(rewrite: _VocabRewrite, nodes: VocabNodes, table: np.ndarray) -> tuple[str, str]:
    """Gather -> Reshape(scales), GatherBlockQuantized, Reshape; returns (data, scales) names."""
    from onnx import helper, numpy_helper

    assert nodes.gather is not None
    data, scales, k_blocks = rewrite.quantized(table, nodes.table or "embedding")
    gather = next(n for n in rewrite.graph.node if n.name == nodes.gather)
    prefix = nodes.gather.rsplit("/", 1)[0]
    shape3, out_shape = f"{prefix}/scales_shape", f"{prefix}/output_shape"
    rewrite.new_inits += [
        numpy_helper.from_array(np.array([table.shape[0], k_blocks, 1], np.int64), shape3),
        numpy_helper.from_array(np.array([0, 0, table.shape[1]], np.int64), out_shape),
    ]
    blocks_out = f"{gather.output[0]}/blocks"
    replacement = [
        helper.make_node("Reshape", [scales, shape3], [f"{scales}/rank3"], name=f"{prefix}/ScalesReshape"),
        helper.make_node(
            "GatherBlockQuantized",
            [data, gather.input[1], f"{scales}/rank3"],
            [blocks_out],
            name=f"{prefix}/GatherBlockQuantized",
            domain="com.microsoft",
            gather_axis=0,
            quantize_axis=2,
            block_size=rewrite.block,
            bits=rewrite.bits,
        ),
        helper.make_node("Reshape", [blocks_out, out_shape], [gather.output[0]], name=f"{prefix}/Reshape"),
    ]
    _replace(rewrite.graph, gather, replacement)
    return data, scales


def _quantize_head(
    rewrite: _VocabRewrite,
    nodes: VocabNodes,
    inits: dict[str, Any],
    table: np.ndarray | None,
    shared: tuple[str, str] | None,
    accuracy_level: int,
) -> None:
    """LM head MatMul -> MatMulNBits, reading the embedding's quantized table when `shared`."""
    from onnx import helper, numpy_helper

    assert nodes.head is not None and nodes.head_weight is not None
    head = next(n for n in rewrite.graph.node if n.name == nodes.head)
    if shared is not None:
        data, scales = shared
    else:
        weight = numpy_helper.to_array(inits[nodes.head_weight])
        data, scales, _ = rewrite.quantized(weight if nodes.tied else weight.T, f"{nodes.head}/weight")
    vocab = int(table.shape[0]) if nodes.tied and table is not None else int(inits[nodes.head_weight].dims[1])
    hidden = int(table.shape[1]) if table is not None else int(inits[nodes.head_weight].dims[0])
    matmul = helper.make_node(
        "MatMulNBits",
        [head.input[0], data, scales],
        list(head.output),
        name=f"{nodes.head.rsplit('/', 1)[0]}/MatMulNBits",
        domain="com.microsoft",
        K=hidden,
        N=vocab,
        bits=rewrite.bits,
        block_size=rewrite.block,
        accuracy_level=accuracy_level,
    )
    _replace(rewrite.graph, head, [matmul])


def _replace(graph: Any, old: Any, new: list[Any]) -> None:
    """Put `new` where `old` was: the graph stays topologically sorted."""
    at = list(graph.node).index(old)
    graph.node.remove(old)
    for offset, node in enumerate(new):
        graph.node.insert(at + offset, node)


def _drop_unused(graph: Any) -> None:
    """Transposes and initializers that nothing reads any more (the float table and head)."""
    while True:
        used = graph_reads(graph)
        dead = [n for n in graph.node if n.op_type == "Transpose" and n.output[0] not in used]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)


def _bytes(inits: dict[str, Any], names: set[Any]) -> int:
    from onnx import numpy_helper

    return sum(numpy_helper.to_array(inits[n]).nbytes for n in names if n in inits)
