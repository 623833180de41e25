"""The calls into onnxruntime.quantization, with the options picked for hybridrt graphs; the
graph rewrites that hybridrt adds around them live in rewrites.py. What they cannot do here:

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
  float ones (the scan's input in a Mamba mixer); rewrites.restore_float_inputs undoes that.
- quantize_static's entropy and percentile calibrators stack every collected output into
  one array, which fails on feeds of different lengths (prompt, chunk, decode step); its
  strided collection, one feed at a time, merges histograms instead.
- Importing matmul_nbits_quantizer calls logging.basicConfig(level=INFO) on the root logger
  and the quantizers print progress to stdout: `quiet()` keeps both out of the caller's way.
- int8-dynamic stores uint8 weights (U8U8), not quantize_dynamic's default int8 (U8S8):
  on x86 CPUs without VNNI (AVX2, e.g. this Zen 3 box) MLAS computes U8S8 with VPMADDUBSW,
  which saturates each pair a0*b0 + a1*b1 at int16. DynamicQuantizeLinear's uint8
  activations sit around their zero point (often 110-160), so with int8 weights near 127 a
  pair overflows: measured on the tiny lfm2, ORT's MatMulInteger equals that saturating model
  exactly and puts 17% error into layer 0's down_proj output (15 dB SQNR where the same
  arithmetic without saturation gives 31 dB), most of its mean KL (0.084 of 0.088). The U8U8
  kernel has no saturation (exact on any input). Per-channel weights then help (they pushed
  more columns to +-127, i.e. more saturation, under U8S8): mean KL 0.088 -> 0.0072 on lfm2,
  0.041 -> 0.0088 on nemotron_h, lower on 13 of the other 16 families (equal on 2,
  qwen3_5_moe 0.0039 -> 0.0048). reduce_range (7-bit U8S8 weights, ORT's other remedy) avoids
  the overflow but loses a weight bit (KL 0.0095 on lfm2, 0.016 on nemotron_h, per channel).
  The U8U8 kernel is slower on AVX2 (one 768x3072 MatMul: 61 -> 86 us for one row, 3.6 ->
  4.7 ms for 128); the default model's decode did not slow down measurably.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import QuantizationError
from .modes import QUANTIZED_OP_TYPES

if TYPE_CHECKING:  # calibration imports onnxruntime.quantization, which this module loads on first use
    from .calibration import CalibrationReader

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
    return onnx.load(str(out))  # the caller applies rewrites.restore_float_inputs and split_shared_quantizers


def int8_dynamic(model: Any, work: Path, nodes: list[str], external: bool) -> Any:
    """8-bit weights (uint8 with a zero point per output channel), uint8 activations quantized
    per call at run time: U8U8, whose kernel cannot saturate (see the module docstring)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = work / "model.onnx"
    with quiet():
        quantize_dynamic(
            model,
            str(out),
            op_types_to_quantize=list(QUANTIZED_OP_TYPES),
            nodes_to_quantize=_nonempty(nodes),
            per_channel=True,
            weight_type=QuantType.QUInt8,
            use_external_data_format=external,
            # A fragment of a streamed export (quantization.direct) reads values typed elsewhere.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    return onnx.load(str(out))


def weight_only(
    model: Any,
    bits: int,
    algo: str,
    block_size: int,
    nodes: list[str],
    reader: CalibrationReader | None,
    symmetric: bool = False,
) -> Any:
    """MatMulNBits with `bits`-bit block-wise weights (rtn, hqq or gptq), with no zero points
    when `symmetric`; the caller sets the accuracy level (rewrites.set_accuracy_level)."""
    _nonempty(nodes)
    with quiet():
        if algo == "gptq":
            if reader is None:
                raise QuantizationError("GPTQ needs calibration text (--calibration)")
            model = _gptq(model, bits, block_size, nodes, reader, symmetric)
            if bits == 4:
                return model
            algo = "rtn"  # 8 bits: GPTQ left fake-quantized float weights; store them as MatMulNBits
        from onnxruntime.quantization import matmul_nbits_quantizer as mnb

        if algo in ("rtn", "mse"):
            symmetric = symmetric or algo == "mse"
            config: Any = mnb.DefaultWeightOnlyQuantConfig(block_size=block_size, bits=bits, is_symmetric=symmetric)
        else:
            config = mnb.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits)
        quantizer = mnb.MatMulNBitsQuantizer(
            model, bits=bits, block_size=block_size, nodes_to_exclude=_others(model, nodes), algo_config=config
        )
        if algo == "mse":
            quantizer.node_quantizer.qbits_block_quant = _searched_scales(block_size, bits)
        quantizer.process()
        return quantizer.model.model


def _searched_scales(block_size: int, bits: int) -> Any:
    """qbits_block_quant for onnxruntime's node quantizer (which writes the MatMulNBits node):
    the blocks' numbers from quantization.search, in the same symmetric layout."""
    from .search import search_blocks

    def quantize(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        packed, scales = search_blocks(np.asarray(weight, np.float32), block_size, bits)
        return packed, scales.astype(weight.dtype), np.zeros(0, np.uint8)

    return quantize


def _gptq(
    model: Any, bits: int, block_size: int, nodes: list[str], reader: CalibrationReader, symmetric: bool = False
) -> Any:
    """onnxruntime's GPTQ, called with a weight config that names every MatMul:
    MatMulNBitsQuantizer's GPTQ path ignores nodes_to_exclude and would quantize them all."""
    from onnxruntime.quantization.neural_compressor import gptq_quantize

    inits = {t.name: t for t in model.graph.initializer}
    chosen = set(nodes)
    config: dict[str, Any] = dict.fromkeys(_others(model, nodes), "fp32")
    for node in model.graph.node:
        if node.name in chosen:
            odd = -(-inits[node.input[1]].dims[0] // block_size) % 2 == 1
            scheme = "sym" if odd or symmetric else "asym"
            config[node.name] = {"bits": bits, "group_size": block_size, "scheme": scheme}
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


def block_quantize(matrix_vh: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's symmetric block quantizer over the rows of [vocab, hidden]: packed
    [vocab, k_blocks, blob] uint8 and scales [vocab, k_blocks] (MatMulNBits' layout of B)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, bits=bits)
    packed, scales, _ = DefaultWeightOnlyQuantizer(config).qbits_block_quant(
        np.ascontiguousarray(matrix_vh.T.astype(np.float32))
    )
    return packed, scales
