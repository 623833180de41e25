"""Quantization of exported graphs, built on onnxruntime.quantization.

Modes: int8-static (QDQ, calibrated on text through prompt, chunk and decode-step feeds),
int8-dynamic, int4 and int8-weight (MatMulNBits: rtn, hqq, gptq). The result is an
ordinary hybridrt directory whose manifest carries a quality report against the float
parent. Importing this package is light; onnxruntime.quantization loads on first use.
"""

from __future__ import annotations

from typing import Any

from .config import ALGOS, CALIB_METHODS, MODES, QuantConfig, QuantizationError
from .selection import DEFAULT_KEEP_FLOAT, KeepFloat

__all__ = [
    "ALGOS",
    "CALIB_METHODS",
    "DEFAULT_KEEP_FLOAT",
    "MODES",
    "KeepFloat",
    "QuantConfig",
    "QuantizationError",
    "quantize",
]


def quantize(src: Any, out: Any, mode: str = "int8-static", **kwargs: Any) -> Any:
    """Quantize an exported ONNX directory (see hybridrt.quantization.api.quantize)."""
    from .api import quantize as _quantize

    return _quantize(src, out, mode, **kwargs)
