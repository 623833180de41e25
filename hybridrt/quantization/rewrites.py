"""hybridrt's own graph rewrites around onnxruntime.quantization's quantizers (methods.py
holds the calls into onnxruntime; everything here edits the ONNX graph itself).

Before quantizing: `give_private_weights` (each chosen MatMul its own weight). After:
`restore_float_inputs` and `split_shared_quantizers` (int8-static), `set_accuracy_level`
(MatMulNBits), and `quantize_vocab`, the vocabulary matrices in every mode.

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

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import QuantizationError
from .methods import block_quantize

# Weights ------------------------------------------------------------------------------


def constant_weights(graph: Any) -> dict[str, tuple[str, bool]]:
    """MatMul node name -> (initializer, transposed) for weights that are an initializer,
    or a 2-D Transpose of one (a weight tied to the embedding: lm_head = embedding^T)."""
    inits = {t.name: t for t in graph.initializer}
    transposes = {
        n.output[0]: n.input[0]
        for n in graph.node
        if n.op_type == "Transpose" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2 and _swaps(n)
    }
    found: dict[str, tuple[str, bool]] = {}
    for node in graph.node:
        if node.op_type != "MatMul" or len(node.input) < 2:
            continue
        b = node.input[1]
        if b in inits and len(inits[b].dims) == 2:
            found[node.name] = (b, False)
        elif b in transposes:
            found[node.name] = (transposes[b], True)
    return found


def _swaps(node: Any) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return perm in (None, [1, 0])


def give_private_weights(graph: Any, names: list[str]) -> list[str]:
    """Each MatMul in `names` gets a weight initializer of its own, [K, N].

    The quantizers replace a weight in place: a weight tied to the embedding (reached
    through a Transpose) is skipped by all of them, and one initializer shared by two
    quantized nodes would be quantized twice under one name. A private copy fixes both;
    the original stays for its other users (the embedding Gather). Returns the nodes that
    got one."""
    from onnx import numpy_helper

    weights = constant_weights(graph)
    inits = {t.name: t for t in graph.initializer}
    uses = Counter(i for n in graph.node for i in n.input)
    chosen = set(names)
    copied, unhooked = [], set()
    for node in graph.node:
        if node.name not in chosen or node.name not in weights:
            continue
        name, transposed = weights[node.name]
        if not transposed and uses[name] == 1:
            continue
        array = numpy_helper.to_array(inits[name])
        private = numpy_helper.from_array((array.T if transposed else array).copy(), f"{node.name}/weight")
        graph.initializer.append(private)
        if transposed:
            unhooked.add(node.input[1])
        node.input[1] = private.name
        copied.append(node.name)
    used = graph_reads(graph)
    dead = [n for n in graph.node if n.output and n.output[0] in unhooked - used]
    for node in dead:
        graph.node.remove(node)
    return copied


# After onnxruntime's quantizers ----------------------------------------------------------


def restore_float_inputs(graph: Any, quantized: set[str]) -> None:
    """QDQ rewires every consumer of a quantized activation to its DequantizeLinear output.
    In a Mamba mixer the input of x_proj also feeds the scan (dt * x) and the D skip, which
    would then read int8-rounded values; give such float consumers the float tensor back.
    A graph output behind a DequantizeLinear would be a quantized state: refused."""
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.name in quantized or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for i, name in enumerate(node.input):
            dq = producer.get(name)
            q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[i] = q.input[0]
    for op_type in ("DequantizeLinear", "QuantizeLinear"):  # pairs nothing reads any more
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        for node in [n for n in graph.node if n.op_type == op_type and n.output[0] not in used]:
            graph.node.remove(node)
    for value in graph.output:
        if value.name in producer and producer[value.name].op_type == "DequantizeLinear":
            raise QuantizationError(f"graph output {value.name} would be quantized; exclude the nodes that read it")


def split_shared_quantizers(graph: Any) -> None:
    """One QuantizeLinear -> DequantizeLinear pair per MatMul that reads a quantized activation.

    quantize_static quantizes a tensor once for all its readers: q, k and v share the
    normed input, as do gate and up. onnxruntime's CPU fusion (DQ, DQ -> MatMul into
    MatMulIntegerToFloat) skips a MatMul whose activation comes from a QuantizeLinear that
    feeds other nodes too, and common-subexpression elimination merges identical pairs back,
    so such MatMuls ran as float MatMuls on weights dequantized at every call (jamba-125m
    decoded at 5.2 tokens/s). Each extra reader gets its own pair with its own copy of the
    scale and zero point: the values (and the numbers) are unchanged, the pairs stay distinct."""
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    inits = {t.name: t for t in graph.initializer}
    for q in [n for n in graph.node if n.op_type == "QuantizeLinear"]:
        if not all(name in inits for name in q.input[1:]):
            continue
        pairs = [
            (dq, r)
            for dq in readers.get(q.output[0], [])
            if dq.op_type == "DequantizeLinear" and list(dq.input[1:]) == list(q.input[1:])
            for r in readers.get(dq.output[0], [])
        ]
        for k, (dq, reader) in enumerate(pairs[1:], 1):
            params = []
            for name in q.input[1:]:
                copied = copy.deepcopy(inits[name])
                copied.name = f"{name}/{k}"
                graph.initializer.append(copied)
                params.append(copied.name)
            q2 = copy.deepcopy(q)
            q2.name, q2.input[1:], q2.output[0] = f"{q.name}/{k}", params, f"{q.output[0]}/{k}"
            dq2 = copy.deepcopy(dq)
            dq2.name, dq2.input[:], dq2.output[0] = f"{dq.name}/{k}", [q2.output[0], *params], f"{dq.output[0]}/{k}"
            for i, name in enumerate(reader.input):
                if name == dq.output[0]:
                    reader.input[i] = dq2.output[0]
            at = list(graph.node).index(reader)
            graph.node.insert(at, dq2)
            graph.node.insert(at, q2)


def set_accuracy_level(model: Any, level: int) -> Any:
    """Every MatMulNBits node computes at `level`, whichever quantizer wrote it."""
    import onnx

    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", level)])
    return model


# The vocabulary matrices (see the module docstring) -------------------------------------


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


def node_reads(node: Any) -> set[str]:
    """The values a node reads: its inputs, and the outer-scope names its subgraphs (an If's
    branches) read."""
    import onnx

    names = set(node.input)
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            inner = {o for n in a.g.node for o in n.output} | {t.name for t in a.g.initializer}
            inner |= {i.name for i in a.g.input}
            names |= {i for n in a.g.node for i in node_reads(n) if i not in inner}
    return names


def graph_reads(graph: Any) -> set[str]:
    """Every value some node of `graph` reads (subgraphs included), and its outputs."""
    return {i for n in graph.node for i in node_reads(n)} | {o.name for o in graph.output}


def order_nodes(graph: Any) -> None:
    """Order the top-level nodes so that each comes after every value it reads, counting the
    outer-scope values an If's branches read (onnxruntime's quantizers order by a node's
    explicit inputs only, which can move an If above what its branches read). The given order
    is kept wherever it already holds."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    done: list[Any] = []
    pending = list(graph.node)
    while pending:
        rest = []
        for node in pending:
            if node_reads(node) <= known:
                done.append(node)
                known.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise QuantizationError(f"the quantized graph reads a value no node writes (at {rest[0].name})")
        pending = rest
    del graph.node[:]
    graph.node.extend(done)
