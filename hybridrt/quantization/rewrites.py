"""hybridrt's own graph rewrites around onnxruntime.quantization's quantizers (methods.py
holds the calls into onnxruntime; everything here edits the ONNX graph itself).

Before quantizing: `give_private_weights` (each chosen MatMul its own weight). After:
`restore_float_inputs` and `split_shared_quantizers` (int8-static), `set_accuracy_level` and
`fold_biases` (MatMulNBits); the vocabulary matrices are vocab.py's, in every mode.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..errors import QuantizationError
from ..graphs.edit import graph_reads, node_reads

# Weights ------------------------------------------------------------------------------


def constant_weights(graph: Any) -> dict[str, tuple[str, bool]]:
    """MatMul node name -> (initializer, transposed) for weights that are an initializer,
    or a 2-D Transpose of one (a weight tied to the embedding: lm_head = embedding^T), or read
    transposed by a FusedMatMul(transB=1) (a tied head as export writes it)."""
    inits = {t.name: t for t in graph.initializer}
    transposes = {
        n.output[0]: n.input[0]
        for n in graph.node
        if n.op_type == "Transpose" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2 and _swaps(n)
    }
    found: dict[str, tuple[str, bool]] = {}
    for node in graph.node:
        if _reads_transposed(node) and node.input[1] in inits and len(inits[node.input[1]].dims) == 2:
            found[node.name] = (node.input[1], True)
        if node.op_type != "MatMul" or len(node.input) < 2:
            continue
        b = node.input[1]
        if b in inits and len(inits[b].dims) == 2:
            found[node.name] = (b, False)
        elif b in transposes:
            found[node.name] = (transposes[b], True)
    return found


def _reads_transposed(node: Any) -> bool:
    """A com.microsoft FusedMatMul that is x @ B^T and nothing more (export.compose writes a
    tied LM head so)."""
    if node.op_type != "FusedMatMul" or node.domain != "com.microsoft" or len(node.input) != 2:
        return False
    attrs = {a.name: (a.f if a.type == a.FLOAT else a.i) for a in node.attribute}
    plain = {"transA": 0, "transB": 1, "alpha": 1.0, "transBatchA": 0, "transBatchB": 0}
    return attrs.get("transB") == 1 and all(attrs.get(k, v if k != "transB" else 0) == v for k, v in plain.items())


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
        if transposed and node.op_type == "FusedMatMul":  # x @ W^T -> MatMul(x, private W^T)
            node.op_type, node.domain = "MatMul", ""
            del node.attribute[:]
        elif transposed:
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


def fold_biases(graph: Any) -> int:
    """A constant bias added to a MatMulNBits product becomes the node's own bias input, in
    place: one node instead of two in every step. Either the Add reads the product itself, or
    the product is split along its last axis and some parts alone get a bias (Mamba2's dt_bias
    on the dt part of in_proj): the bias is then zero over the other parts. The kernel adds it
    to the same float32 sum, so the values are unchanged. Returns how many Adds went."""
    from onnx import numpy_helper

    scope = _Scope.of(graph)
    removed: list[Any] = []
    added: list[Any] = []
    for node in graph.node:
        if node.op_type != "MatMulNBits" or (len(node.input) > 5 and node.input[5]):
            continue
        found = _foldable(node, scope)
        if found is None:
            continue
        bias, moved, split = found
        name = f"{node.name}/bias"
        added.append(numpy_helper.from_array(bias, name))
        node.input.extend([""] * (5 - len(node.input)) + [name])
        for add, value in moved:  # what wrote the Add's input writes its output now
            writer = split if value != node.output[0] else node
            writer.output[list(writer.output).index(value)] = add.output[0]
            removed.append(add)
    biases = {i for add in removed for i in add.input if i in scope.inits}
    for add in removed:
        graph.node.remove(add)
    graph.initializer.extend(added)
    still = {i for n in graph.node for i in node_reads(n)}
    for t in [t for t in graph.initializer if t.name in biases and t.name not in still]:
        graph.initializer.remove(t)
    made = {o for n in graph.node for o in n.output}
    for v in [v for v in graph.value_info if v.name not in made]:
        graph.value_info.remove(v)
    return len(removed)


@dataclass
class _Scope:
    """What fold_biases reads of a graph: its constants, each value's readers, its outputs."""

    inits: dict[str, Any]
    readers: dict[str, list[Any]]
    outputs: set[str]

    @classmethod
    def of(cls, graph: Any) -> _Scope:
        readers: dict[str, list[Any]] = {}
        for node in graph.node:
            for i in node_reads(node):
                readers.setdefault(i, []).append(node)
        return cls({t.name: t for t in graph.initializer}, readers, {o.name for o in graph.output})

    def bias_add(self, value: str, size: int) -> tuple[Any, Any] | None:
        """(Add, its constant [size] bias) when `value` is read by that Add alone."""
        import numpy as np
        from onnx import numpy_helper

        users = self.readers.get(value, [])
        if value in self.outputs or len(users) != 1 or users[0].op_type != "Add":
            return None
        add = users[0]
        other = [i for i in add.input if i != value]
        if len(other) != 1 or other[0] not in self.inits:
            return None
        b = numpy_helper.to_array(self.inits[other[0]])
        if b.dtype != np.float32 or b.size != size or b.shape[-1:] != (size,):
            return None
        return add, b.reshape(size)


def _foldable(node: Any, scope: _Scope) -> tuple[Any, list[tuple[Any, str]], Any] | None:
    """For a MatMulNBits node: its bias [N], the Adds that go with the value each read (the
    product, or a part of it), and the Split between (None when the Add reads the product)."""
    import numpy as np
    from onnx import numpy_helper

    n = next(a.i for a in node.attribute if a.name == "N")
    bias = np.zeros(n, np.float32)
    found = scope.bias_add(node.output[0], n)
    if found is not None:
        bias[:] = found[1]
        return bias, [(found[0], node.output[0])], None
    users = scope.readers.get(node.output[0], [])
    split = users[0] if len(users) == 1 and users[0].op_type == "Split" else None
    axis = next((a.i for a in split.attribute if a.name == "axis"), 0) if split is not None else 0
    # MatMulNBits reads [b, l, K] in these graphs: axis 2 is the last one.
    if split is None or axis not in (-1, 2) or len(split.input) < 2 or split.input[1] not in scope.inits:
        return None
    sizes = numpy_helper.to_array(scope.inits[split.input[1]]).tolist()
    if sum(sizes) != n:
        return None
    moved, start = [], 0
    for part, size in zip(split.output, sizes):
        found = scope.bias_add(part, size)
        if found is not None:
            bias[start : start + size] = found[1]
            moved.append((found[0], part))
        start += size
    return (bias, moved, split) if moved else None


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
