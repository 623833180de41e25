"""The quantizers. onnxruntime.quantization does the work; this module picks its options for
hybridrt graphs and works around what it cannot do with them:

- quant_pre_process is not used: its symbolic shape inference cannot relate the contract's
  dims (it stops at "Cannot determine if -seq + total_len < 0" and raises "Incomplete
  symbolic shape inference"), and with that step skipped it only adds opset imports.
  quantize_static's own ONNX shape inference passes the com.microsoft nodes through
  (LinearAttention is left unquantized and untouched), and only MatMul is quantized.
- The neural-compressor code behind RTNWeightOnlyQuantConfig and GPTQ packs 4-bit
  asymmetric zero points across columns, which breaks when a column holds an odd number of
  blocks (K / block_size odd, e.g. K = 32 with block 32). RTN therefore uses onnxruntime's
  own blockwise round-to-nearest quantizer (DefaultWeightOnlyQuantConfig), and GPTQ
  quantizes such nodes symmetrically (no zero points to pack).
- GPTQ emits MatMulNBits only for 4 bits and leaves fake-quantized float weights for 8, so
  int8-weight GPTQ re-quantizes those with the 8-bit RTN quantizer, as onnxruntime's 4-bit
  GPTQ path does internally with its own grid.
- QDQ hands every consumer of a quantized activation the dequantized tensor, also the
  float ones (the scan's input in a Mamba mixer); restore_float_inputs undoes that.
- quantize_static's entropy and percentile calibrators stack every collected output into
  one array, which fails on feeds of different lengths (prompt, chunk, decode step); its
  strided collection, one feed at a time, merges histograms instead.
- Importing matmul_nbits_quantizer calls logging.basicConfig(level=INFO) on the root logger
  and the quantizers print progress to stdout: `quiet()` keeps both out of the caller's way.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .calibration import CalibrationReader
from .config import QuantizationError
from .selection import QUANTIZED_OP_TYPES

CALIBRATION_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    root = logging.getLogger()
    guard, level = logging.NullHandler(), root.level
    root.addHandler(guard)  # a root handler makes the import-time basicConfig a no-op
    root.setLevel(logging.ERROR)  # also "consider pre-processing": skipped on purpose (see above)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeHandler(guard)
        root.setLevel(level)


def int8_static(
    model: Any, work: Path, nodes: list[str], reader: CalibrationReader, calib_method: str, external: bool
) -> Any:
    """QDQ: per-channel int8 weights, int8 activations with ranges from the reader's feeds."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    out = work / "model.onnx"
    with quiet():
        quantize_static(
            model,
            str(out),
            reader,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OP_TYPES),
            nodes_to_quantize=_nonempty(nodes),
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, CALIBRATION_METHODS[calib_method]),
            use_external_data_format=external,
            # One feed per collection: the histogram calibrators (entropy, percentile) stack
            # a collection's outputs into one array, and prompt, chunk and decode feeds differ
            # in length. Ranges and histograms merge across collections.
            extra_options={
                "CalibStridedMinMax": 1,
                # A MatMul's output feeds float ops (the scan's dt, B, C; the residual add):
                # quantize its inputs only, so that it runs as MatMulIntegerToFloat.
                "OpTypesToExcludeOutputQuantization": list(QUANTIZED_OP_TYPES),
            },
        )
    quantized = onnx.load(str(out))
    restore_float_inputs(quantized.graph, set(nodes))
    split_shared_quantizers(quantized.graph)
    return quantized


def split_shared_quantizers(graph: Any) -> None:
    """One QuantizeLinear -> DequantizeLinear pair per MatMul that reads a quantized activation.

    quantize_static quantizes a tensor once for all its readers: q, k and v share the
    normed input, as do gate and up. onnxruntime's CPU fusion (DQ, DQ -> MatMul into
    MatMulIntegerToFloat) skips a MatMul whose activation comes from a QuantizeLinear that
    feeds other nodes too, and common-subexpression elimination merges identical pairs back,
    so such MatMuls ran as float MatMuls on weights dequantized at every call (jamba-125m
    decoded at 5.2 tokens/s). Each extra reader gets its own pair with its own copy of the
    scale and zero point: the values (and the numbers) are unchanged, the pairs stay distinct."""
    import copy

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


def int8_dynamic(model: Any, work: Path, nodes: list[str], external: bool) -> Any:
    """int8 weights (per tensor), activations quantized per call at run time."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = work / "model.onnx"
    with quiet():
        quantize_dynamic(
            model,
            str(out),
            op_types_to_quantize=list(QUANTIZED_OP_TYPES),
            nodes_to_quantize=_nonempty(nodes),
            weight_type=QuantType.QInt8,
            use_external_data_format=external,
        )
    return onnx.load(str(out))


def weight_only(
    model: Any,
    bits: int,
    algo: str,
    block_size: int,
    nodes: list[str],
    reader: CalibrationReader | None,
    accuracy_level: int = 4,
) -> Any:
    """MatMulNBits with `bits`-bit block-wise weights (rtn, hqq or gptq)."""
    return _set_accuracy_level(_weight_only(model, bits, algo, block_size, nodes, reader), accuracy_level)


def _set_accuracy_level(model: Any, level: int) -> Any:
    """Every MatMulNBits node computes at `level`, whichever quantizer wrote it."""
    import onnx

    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", level)])
    return model


def _weight_only(
    model: Any, bits: int, algo: str, block_size: int, nodes: list[str], reader: CalibrationReader | None
) -> Any:
    _nonempty(nodes)
    with quiet():
        if algo == "gptq":
            if reader is None:
                raise QuantizationError("GPTQ needs calibration text (--calibration)")
            model = _gptq(model, bits, block_size, nodes, reader)
            if bits == 4:
                return model
            algo = "rtn"  # 8 bits: GPTQ left fake-quantized float weights; store them as MatMulNBits
        from onnxruntime.quantization import matmul_nbits_quantizer as mnb

        if algo == "rtn":
            config: Any = mnb.DefaultWeightOnlyQuantConfig(block_size=block_size, bits=bits)
        else:
            config = mnb.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits)
        quantizer = mnb.MatMulNBitsQuantizer(
            model, bits=bits, block_size=block_size, nodes_to_exclude=_others(model, nodes), algo_config=config
        )
        quantizer.process()
        return quantizer.model.model


def _gptq(model: Any, bits: int, block_size: int, nodes: list[str], reader: CalibrationReader) -> Any:
    """onnxruntime's GPTQ, called with a weight config that names every MatMul:
    MatMulNBitsQuantizer's GPTQ path ignores nodes_to_exclude and would quantize them all."""
    from onnxruntime.quantization.neural_compressor import gptq_quantize

    inits = {t.name: t for t in model.graph.initializer}
    chosen = set(nodes)
    config: dict[str, Any] = dict.fromkeys(_others(model, nodes), "fp32")
    for node in model.graph.node:
        if node.name in chosen:
            odd = -(-inits[node.input[1]].dims[0] // block_size) % 2 == 1
            config[node.name] = {"bits": bits, "group_size": block_size, "scheme": "sym" if odd else "asym"}
    reader.rewind()
    batches = ((feed, None) for feed in iter(reader.get_next, None))
    return gptq_quantize(model, batches, weight_config=config, n_samples=-1).model


def _others(model: Any, nodes: list[str]) -> list[str]:
    chosen = set(nodes)
    return [n.name for n in model.graph.node if n.op_type in QUANTIZED_OP_TYPES and n.name not in chosen]


def _nonempty(nodes: list[str]) -> list[str]:
    # onnxruntime reads an empty nodes_to_quantize as "every node".
    if not nodes:
        raise QuantizationError("no node is left to quantize after the exclusions; check --exclude/--include")
    return nodes
