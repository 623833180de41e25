"""Quantization of exported graphs, built on onnxruntime.quantization.

Modes: int8-static (QDQ, calibrated on text through prompt, chunk and decode-step feeds),
int8-dynamic, int4 and int8-weight (MatMulNBits: rtn, hqq, gptq). The result is an
ordinary hybridrt directory whose manifest carries a quality report against the float
parent. Importing this package is light; `quantize` (hybridrt.quantization.api.quantize)
and onnxruntime.quantization load on first use.

By file: methods.py calls onnxruntime.quantization's quantizers (half.py its float16
converter); rewrites.py holds hybridrt's
own graph rewrites around them and vocab.py the block-wise embedding and LM head;
selection.py decides what is quantized, calibration.py feeds the calibrators, report.py
measures the result, api.py runs the steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import QuantizationError
from .modes import ALGOS, CALIB_METHODS, MODES, QuantConfig
from .selection import DEFAULT_KEEP_FLOAT, KeepFloat

if TYPE_CHECKING:
    from .api import quantize

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


def __getattr__(name: str) -> Any:
    # `quantize` is the api module's function itself (its signature and docstring), loaded
    # on first use so that importing the package stays light.
    if name == "quantize":
        from .api import quantize

        return quantize
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
