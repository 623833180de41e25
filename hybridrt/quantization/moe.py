"""Mixture-of-experts layers to 4 or 8 bits: each com.microsoft MoE node (models.ops.moe)
becomes a QMoE node whose experts are stored block-wise like MatMulNBits weights.

onnxruntime's MatMul quantizers see only 2-D weights, so without this a MoE model's experts,
nearly all of its parameters, would stay float32. QMoE reads, per expert, the packed blocks
[N, K * bits / 8], scales [N, K / block] and packed zero points [N, ceil(K / block * bits / 8)]
that onnxruntime's own block quantizer (quantize_matmul_4bits / 8bits) writes for a weight
[K, N]; symmetric blocks leave the zero points out (their implicit value is 2^(bits-1)).
Routing, activation and the experts' interleaving carry over from the MoE node unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import QuantizationError

MS_DOMAIN = "com.microsoft"
_CARRIED = ("k", "normalize_routing_weights", "activation_type", "swiglu_fusion", "activation_alpha", "activation_beta")


def moe_nodes(graph: Any) -> dict[str, tuple[str, str]]:
    """MoE node name -> (fc1, fc2) initializer names, for the nodes whose experts are constants."""
    inits = {t.name for t in graph.initializer}
    found = {}
    for node in graph.node:
        if node.op_type == "MoE" and node.domain == MS_DOMAIN and node.input[2] in inits and node.input[4] in inits:
            found[node.name] = (node.input[2], node.input[4])
    return found


def expert_block(graph: Any, name: str, requested: int) -> int | None:
    """The block size for MoE node `name`'s experts: the largest power of two from
    `requested` down to 16 that divides both the hidden size and the experts' width (QMoE
    takes one block size for both), None if there is none."""
    fc1, fc2 = moe_nodes(graph)[name]
    dims = {t.name: list(t.dims) for t in graph.initializer if t.name in (fc1, fc2)}
    hidden, inter = dims[fc1][2], dims[fc2][2]
    block = requested
    while block >= 16:
        if hidden % block == 0 and inter % block == 0:
            return block
        block //= 2
    return None


def quantize_moe(
    graph: Any, names: list[str], bits: int, block: int, symmetric: bool, accuracy_level: int, search: bool = False
) -> int:
    """Replace the MoE nodes in `names` by QMoE with `bits`-bit experts in blocks of `block`
    (or the largest smaller one that divides the experts' sizes: expert_block) along each
    expert's input dimension; in place. Returns how many."""
    from onnx import helper, numpy_helper

    weights = moe_nodes(graph)
    inits = {t.name: t for t in graph.initializer}
    chosen = [name for name in names if name in weights]
    replaced: dict[str, Any] = {}
    tensors: list[Any] = []
    for node in graph.node:
        if node.name not in chosen:
            continue
        size = expert_block(graph, node.name, block)
        if size is None:
            raise QuantizationError(f"{node.name}: no block size of 16 or more divides its experts' sizes")
        packed: dict[str, list[str]] = {"weights": [], "scales": [], "zero_points": []}
        for fc, name in zip(("fc1", "fc2"), weights[node.name]):
            w = numpy_helper.to_array(inits[name])  # [E, N, K]
            arrays = _quantize_experts(w, bits, size, symmetric, search)
            for kind, array in zip(("weights", "scales", "zero_points"), arrays):
                if array is not None:
                    tensors.append(numpy_helper.from_array(array, f"{node.name}/{fc}_{kind}"))
                    packed[kind].append(tensors[-1].name)
        (fc1_w, fc2_w), (fc1_s, fc2_s) = packed["weights"], packed["scales"]
        inputs = [node.input[0], node.input[1], fc1_w, fc1_s, "", fc2_w, fc2_s]
        if packed["zero_points"]:  # after the unused fc2 bias and fc3 weights, scales, bias
            inputs += ["", "", "", "", *packed["zero_points"]]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in _CARRIED}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        replaced[node.name] = helper.make_node(
            "QMoE",
            inputs,
            list(node.output),
            name=node.name.removesuffix("MoE") + "QMoE",
            domain=MS_DOMAIN,
            expert_weight_bits=bits,
            block_size=size,
            accuracy_level=accuracy_level,
            **attrs,
        )
    if not replaced:
        return 0
    nodes = [replaced.get(n.name, n) for n in graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    for name in {w for n in replaced for w in weights[n]} - used:
        graph.initializer.remove(inits[name])
    graph.initializer.extend(tensors)
    return len(replaced)


def _quantize_experts(
    w: np.ndarray, bits: int, block: int, symmetric: bool, search: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """w [E, N, K] -> packed [E, N, K * bits / 8] uint8, scales [E, N, K / block] float32,
    zero points [E, N, ceil(K / block * bits / 8)] uint8 (None when symmetric). `search`:
    symmetric blocks with searched scales (quantization.search)."""
    if search:
        from .search import search_blocks

        n = w.shape[1]
        pairs = [search_blocks(np.ascontiguousarray(expert.T, dtype=np.float32), block, bits) for expert in w]
        return np.stack([q.reshape(n, -1) for q, _ in pairs]), np.stack([s for _, s in pairs]), None
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    n = w.shape[1]
    quantizer = DefaultWeightOnlyQuantizer(
        DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric, bits=bits)
    )
    packed, scales, zero_points = [], [], []
    for expert in w:
        q, s, z = quantizer.qbits_block_quant(np.ascontiguousarray(expert.T, dtype=np.float32))  # from [K, N]
        packed.append(q.reshape(n, -1))
        scales.append(s.reshape(n, -1).astype(np.float32))
        zero_points.append(z.reshape(n, -1))
    return np.stack(packed), np.stack(scales), None if symmetric else np.stack(zero_points)
