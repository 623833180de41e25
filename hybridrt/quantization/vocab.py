"""The vocabulary matrices: the embedding table (a Gather on input_ids) and the LM head (the
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

from .config import QuantizationError

# Weights per scale of 8-bit block-wise weights that no --block-size governs (the vocabulary
# matrices, int8-static's float-activation MatMuls): a float scale per 128 weights costs 3%.
INT8_BLOCK = 128


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
    from .selection import constant_weights

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


def quantize_vocab(
    graph: Any, nodes: VocabNodes, chosen: set[str], bits: int, wanted_block: int, accuracy_level: int
) -> dict[str, Any]:
    """Replace the chosen vocabulary nodes by their block-quantized forms, in place.

    Returns the record for the manifest: which nodes, bits, block size, whether one tensor
    serves both, and the bytes of the vocabulary weights before and after."""
    from onnx import helper, numpy_helper

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
    block = block or wanted_block
    by_name = {n.name: n for n in graph.node}
    new_inits: list[Any] = []
    shared = do_gather and do_head and nodes.tied
    gather_data = ("", "")

    def quantized(matrix_vh: np.ndarray, prefix: str) -> tuple[str, str, int]:
        """[vocab, hidden] -> packed [vocab, k_blocks, blob] and scales [vocab, k_blocks]."""
        packed, scales = _block_quantize(matrix_vh, bits, block)
        new_inits.extend(
            [numpy_helper.from_array(packed, f"{prefix}.q{bits}"), numpy_helper.from_array(scales, f"{prefix}.scales")]
        )
        return f"{prefix}.q{bits}", f"{prefix}.scales", int(packed.shape[1])

    if do_gather:
        assert table is not None and nodes.gather is not None
        data, scales, k_blocks = quantized(table, nodes.table or "embedding")
        gather = by_name[nodes.gather]
        prefix = nodes.gather.rsplit("/", 1)[0]
        shape3 = f"{prefix}/scales_shape"
        out_shape = f"{prefix}/output_shape"
        new_inits += [
            numpy_helper.from_array(np.array([table.shape[0], k_blocks, 1], np.int64), shape3),
            numpy_helper.from_array(np.array([0, 0, hidden], np.int64), out_shape),
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
                block_size=block,
                bits=bits,
            ),
            helper.make_node("Reshape", [blocks_out, out_shape], [gather.output[0]], name=f"{prefix}/Reshape"),
        ]
        _replace(graph, gather, replacement)
        record["embedding"] = "GatherBlockQuantized"
        gather_data = (data, scales)
    if do_head:
        assert nodes.head is not None and nodes.head_weight is not None
        head = by_name[nodes.head]
        if shared:
            data, scales = gather_data
        else:
            weight = numpy_helper.to_array(inits[nodes.head_weight])
            data, scales, _ = quantized(weight if nodes.tied else weight.T, f"{nodes.head}/weight")
        vocab = int(table.shape[0]) if nodes.tied and table is not None else int(inits[nodes.head_weight].dims[1])
        matmul = helper.make_node(
            "MatMulNBits",
            [head.input[0], data, scales],
            list(head.output),
            name=f"{nodes.head.rsplit('/', 1)[0]}/MatMulNBits",
            domain="com.microsoft",
            K=hidden,
            N=vocab,
            bits=bits,
            block_size=block,
            accuracy_level=accuracy_level,
        )
        _replace(graph, head, [matmul])
        record["lm_head"] = "MatMulNBits"
    graph.initializer.extend(new_inits)
    _drop_unused(graph)
    # The float table or head weight stays only where a float node still reads it.
    after = _bytes(
        {t.name: t for t in graph.initializer}, {t.name for t in new_inits} | {nodes.table, nodes.head_weight}
    )
    return record | {"shared": shared, "block_size": block, "parent_bytes": before, "bytes": after}


def _block_quantize(matrix_vh: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, bits=bits)
    packed, scales, _ = DefaultWeightOnlyQuantizer(config).qbits_block_quant(
        np.ascontiguousarray(matrix_vh.T.astype(np.float32))
    )
    return packed, scales


def _replace(graph: Any, old: Any, new: list[Any]) -> None:
    """Put `new` where `old` was: the graph stays topologically sorted."""
    at = list(graph.node).index(old)
    graph.node.remove(old)
    for offset, node in enumerate(new):
        graph.node.insert(at + offset, node)


def _drop_unused(graph: Any) -> None:
    """Transposes and initializers that nothing reads any more (the float table and head)."""
    while True:
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
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
