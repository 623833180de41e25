"""`--algo awq`: activation-aware 4-bit weights (AWQ, Lin et al. 2023) in MatMulNBits.

A weight's rounding error reaches the output through the activations that multiply it: an
input channel whose activations are large carries its error that much further. AWQ scales each
input channel k of a MatMul's weight by s_k = mean|x_k|^alpha before quantizing (the channels
that matter get finer steps relative to their values) and divides the activations by s_k before
the product, which leaves the product unchanged in exact arithmetic: x W = (x / s) (s W).

Here alpha is searched per MatMul over ALPHAS on activations recorded from the calibration
text, for the least output error ||X W - (X / s) Q(s W)||^2 with Q the symmetric 4-bit
round-to-nearest of the blocks (alpha = 0, s = 1, is plain quantization, so the search never does
worse on what it measures); s is normalized by the geometric mean of its extremes, as AWQ's
reference does. The chosen s W is then quantized with `mse`'s scale search
(quantization.search) in MatMulNBits' symmetric layout, and the division is one Mul by 1/s on
the node's input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import QuantizationError
from .calibration import CalibrationReader

ALPHAS = np.linspace(0.0, 1.0, 11)
ROWS = 512  # activation rows per MatMul kept for the search (spread over the calibration windows)
SUFFIX = "/awq_scaled"  # the divided input's name: the MatMul's input with this suffix


def record_inputs(
    model: Any, nodes: list[str], reader: CalibrationReader, work: Path, external: bool
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each MatMul in `nodes`: the mean |x| of its input per channel [K] over every
    calibration token, and ROWS of those tokens' inputs [ROWS, K], from the float graph."""
    import onnx
    import onnxruntime as ort

    by_name = {n.name: n for n in model.graph.node}
    inputs = sorted({by_name[n].input[0] for n in nodes})
    path = work / "awq_probe.onnx"
    extra = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in inputs]
    model.graph.output.extend(extra)  # the inputs as outputs of a copy on disk, then taken off again
    try:
        # Weights kept apart stay apart (over 2 GB a graph is not one protobuf); saving them so
        # moves them out of `model`, which reads them back at once.
        onnx.save(model, str(path), save_as_external_data=external, location="awq_probe.data")
        if external:
            onnx.load_external_data_for_model(model, str(work))
    finally:
        for _ in extra:
            model.graph.output.pop()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the inputs as they are
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    rows: dict[str, list[np.ndarray]] = {name: [] for name in inputs}
    reader.rewind()
    feeds = list(iter(reader.get_next, None))
    if not feeds:
        raise QuantizationError("AWQ needs calibration text (--calibration)")
    per_feed = -(-ROWS // len(feeds))
    for feed in feeds:
        for name, x in zip(inputs, session.run(inputs, feed)):
            x = x.reshape(-1, x.shape[-1]).astype(np.float32)
            sums[name] = sums.get(name, 0) + np.abs(x).sum(0)
            counts[name] = counts.get(name, 0) + len(x)
            rows[name].append(x[np.linspace(0, len(x) - 1, min(per_feed, len(x))).astype(int)])
    out = {}
    for n in nodes:
        name = by_name[n].input[0]
        out[n] = (sums[name] / counts[name], np.concatenate(rows[name])[:ROWS])
    return out


def rtn_blocks(weight: np.ndarray, block: int) -> np.ndarray:
    """weight [K, N] after symmetric 4-bit round-to-nearest over blocks of `block` rows of K
    (q4_0's rule: the value of largest magnitude lands on -8), dequantized."""
    k, n = weight.shape
    padded = np.zeros((-(-k // block) * block, n), np.float32)
    padded[:k] = weight
    blocks = padded.reshape(-1, block, n)
    peak = np.take_along_axis(blocks, np.abs(blocks).argmax(1)[:, None, :], 1)
    step = np.where(peak == 0, 1.0, peak / -8.0)
    return (np.clip(np.round(blocks / step), -8, 7) * step).reshape(-1, n)[:k]


def channel_scales(weight: np.ndarray, mean_abs: np.ndarray, x: np.ndarray, block: int) -> tuple[np.ndarray, float]:
    """The input-channel scales s [K] (and their alpha) that leave the least output error on the
    recorded inputs x [R, K] after s W is quantized (module docstring)."""
    reference = x @ weight
    best, best_alpha, best_s = np.inf, 0.0, np.ones(len(mean_abs), np.float32)
    floor = max(float(mean_abs.max()) * 1e-6, 1e-12)
    for alpha in ALPHAS:
        s = np.power(np.maximum(mean_abs, floor), alpha).astype(np.float32)
        s /= np.sqrt(s.max() * s.min())
        error = float(np.square(reference - (x / s) @ rtn_blocks(weight * s[:, None], block)).sum())
        if error < best:
            best, best_alpha, best_s = error, float(alpha), s
    return best_s, best_alpha


def scale_weights(
    model: Any, nodes: list[str], block: int, reader: CalibrationReader, work: Path, external: bool
) -> dict[str, np.ndarray]:
    """Scale each node's weight (an initializer of its own: rewrites.give_private_weights) by its
    channel scales, in place; returns node -> 1/s, what its input is divided by (divide_inputs)."""
    from onnx import numpy_helper

    recorded = record_inputs(model, nodes, reader, work, external)
    inits = {t.name: t for t in model.graph.initializer}
    by_name = {n.name: n for n in model.graph.node}
    divisions = {}
    for name in nodes:
        tensor = inits[by_name[name].input[1]]
        weight = numpy_helper.to_array(tensor).astype(np.float32)
        mean_abs, x = recorded[name]
        s, _ = channel_scales(weight, mean_abs, x, block)
        tensor.CopyFrom(numpy_helper.from_array((weight * s[:, None]).astype(np.float32), tensor.name))
        divisions[name] = (1.0 / s).astype(np.float32)
    return divisions


def divide_inputs(graph: Any, outputs: dict[str, str], divisions: dict[str, np.ndarray]) -> None:
    """Before each quantized node (found by its output, `outputs`: node name -> output value), a
    Mul of its input by the node's 1/s."""
    import onnx
    from onnx import numpy_helper

    by_output = {n.output[0]: n for n in graph.node}
    for name, inverse in divisions.items():
        node = by_output[outputs[name]]
        scaled = f"{node.input[0]}{SUFFIX}/{name}"
        constant = f"{name}{SUFFIX}/inverse"
        graph.initializer.append(numpy_helper.from_array(inverse, constant))
        mul = onnx.helper.make_node("Mul", [node.input[0], constant], [scaled], name=f"{name}{SUFFIX}/Mul")
        graph.node.insert(list(graph.node).index(node), mul)
        node.input[0] = scaled
