"""Quantization settings: the modes, their algorithms, and one frozen dataclass of defaults
that the Python API and `hybridrt quantize` both read."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ..errors import QuantizationError
from ..runtime.input_checks import refuse_unknown

MODES = {
    "int8-static": "int8 weights (per channel) and activations in QDQ format, ranges calibrated on text",
    "int8-dynamic": "8-bit weights (per channel), activations quantized per call (DynamicQuantizeMatMul)",
    "int4": "4-bit block-wise weights (MatMulNBits), float activations",
    "int8-weight": "8-bit block-wise weights (MatMulNBits), float activations",
    "float16": "float16 weights and matrix products, for GPUs; states, the scan and norms stay float32 "
    "(attention too, unless --kv-dtype float16)",
    "none": "weights unchanged (with --kv-dtype int8: only the KV cache is quantized)",
}
# Weight-only algorithms per mode. HQQ's float zero points have no 8-bit CPU kernel
# (MatMulNBits rejects them), so int8-weight offers RTN and GPTQ only; mse searches the scale
# of symmetric 4-bit blocks (quantization.search).
# awq scales each weight's input channels by its activations before mse's search (quantization.awq).
ALGOS = {"int4": ("rtn", "mse", "hqq", "gptq", "awq"), "int8-weight": ("rtn", "gptq")}
SEARCHED = ("mse", "awq")  # the algorithms whose 4-bit blocks' scales are searched (symmetric)
CALIB_METHODS = ("minmax", "entropy", "percentile")
WEIGHT_BITS = {"int8-static": 8, "int8-dynamic": 8, "int4": 4, "int8-weight": 8, "float16": 16, "none": 32}
# --kv-dtype: the attention layers' KV buffers (quantization.kv_cache)
KV_DTYPES = ("float32", "int8", "float16")
# The operators every mode quantizes (the linear layers), besides the vocabulary matrices.
QUANTIZED_OP_TYPES = ("MatMul",)
# Weights per scale of 8-bit block-wise weights that no --block-size governs (the vocabulary
# matrices, int8-static's float-activation MatMuls): a float scale per 128 weights costs 3%.
INT8_BLOCK = 128


@dataclass(frozen=True)
class QuantConfig:
    """One quantization run. `algo` applies to the weight-only modes (int4: mse, int8-weight: rtn);
    `calib_method` to int8-static. Calibration text is cut into `samples` windows of
    `seq_len` tokens; each window gives a prompt feed, a continuation chunk and
    `decode_steps` one-token feeds (see calibration.py)."""

    mode: str = "int8-static"
    algo: str | None = None
    block_size: int = 32
    calib_method: str = "minmax"
    samples: int = 32
    seq_len: int = 128
    decode_steps: int = 4
    exclude: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    # int8-static: MatMuls whose input activation stays float (their weights go 8-bit
    # block-wise); None = selection.DEFAULT_FLOAT_ACTIVATIONS, () = none.
    float_activations: tuple[str, ...] | None = None
    keep_float_default: bool = True
    eval_tokens: int = 1024
    eval_window: int = 256
    agreement_prompts: int = 8
    agreement_tokens: int = 64
    prompt_tokens: int = 16
    # MatMulNBits compute precision: 4 quantizes activations to int8 on the fly (the fast
    # integer CPU kernels); 0 dequantizes weights to float (slower, slightly more exact).
    accuracy_level: int = 4
    # Weight-only blocks without zero points (scale only, values -8..7 at 4 bits), as
    # llama.cpp's q4_0 and onnxruntime-genai store them; False keeps a zero point per block
    # (rtn, gptq). The int4 default, mse, is always symmetric.
    symmetric: bool = False
    # Bits of the embedding table and LM head (vocab.quantize_vocab). 8 in every mode: on the default
    # model a 4-bit LM head tripled the mean KL of int4 (9.6e-3 vs 3.1e-3) for 8% of its size.
    vocab_bits: int = 8
    # KV buffers of the attention layers: "int8" stores them with calibrated per-channel scales
    # (quantization.kv_cache), a quarter of float32's bytes; "float16" (with mode float16) runs
    # attention in float16 with float16 buffers, which onnxruntime's CUDA kernel attends on the GPU.
    kv_dtype: str = "float32"
    max_ppl_ratio: float | None = None
    min_greedy_agreement: float | None = None

    def __post_init__(self) -> None:
        # mse's blocks are symmetric: the search picks a scale, no zero point. (A mode or algo of
        # the wrong type is left for validate() to name.)
        if isinstance(self.mode, str) and isinstance(self.algo, str | None) and self.resolved_algo in SEARCHED:
            object.__setattr__(self, "symmetric", True)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> QuantConfig:
        refuse_unknown(cls, kwargs, QuantizationError, "quantization option")
        for key in ("exclude", "include"):
            if key in kwargs and (kwargs[key] is None or isinstance(kwargs[key], list | tuple)):
                kwargs[key] = tuple(kwargs[key] or ())
        if isinstance(kwargs.get("float_activations"), list | tuple):
            kwargs["float_activations"] = tuple(kwargs["float_activations"])
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @property
    def weight_only(self) -> bool:
        return self.mode in ALGOS

    @property
    def resolved_algo(self) -> str | None:
        """int4 searches its blocks' scales by default (closer to float than rtn's zero points at
        q4_0's speed or better, docs/quantization.md); int8-weight rounds to nearest."""
        if not self.weight_only:
            return None
        return self.algo or ("mse" if self.mode == "int4" else "rtn")

    @property
    def needs_calibration(self) -> bool:
        """Whether the mode's weight quantizer needs calibration feeds (onnxruntime's reader)."""
        return self.mode == "int8-static" or self.resolved_algo in ("gptq", "awq")

    @property
    def needs_text(self) -> bool:
        """Whether anything calibrates on text: the weights' quantizer, or the KV cache's scales."""
        return self.needs_calibration or self.kv_dtype == "int8"

    @property
    def quantizes_weights(self) -> bool:
        return self.mode != "none"

    def validate(self) -> None:
        self._check_types()
        if self.mode not in MODES:
            raise QuantizationError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.kv_dtype not in KV_DTYPES:
            raise QuantizationError(f"unknown KV dtype {self.kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")
        if self.mode == "float16" and self.kv_dtype == "int8":
            raise QuantizationError(
                "--kv-dtype int8 does not combine with float16; quantize the float model with one of them"
            )
        if self.kv_dtype == "float16" and self.mode != "float16":
            raise QuantizationError(
                "--kv-dtype float16 (attention in float16, for onnxruntime's CUDA kernel) goes with --mode float16"
            )
        if self.mode == "none" and self.kv_dtype == "float32":
            raise QuantizationError("mode none quantizes nothing: add --kv-dtype int8, or choose a weight mode")
        if self.symmetric and not self.weight_only:
            modes = ", ".join(ALGOS)
            raise QuantizationError(f"--symmetric applies to the weight-only modes ({modes}), not {self.mode}")
        if self.symmetric and self.resolved_algo == "hqq":
            raise QuantizationError("--symmetric does not apply to hqq, whose blocks need their float zero points")
        if self.algo is not None and not self.weight_only:
            raise QuantizationError(f"--algo applies to the weight-only modes ({', '.join(ALGOS)}), not {self.mode}")
        if self.weight_only and self.resolved_algo not in ALGOS[self.mode]:
            why = " (HQQ's float zero points have no 8-bit CPU kernel)" if self.algo == "hqq" else ""
            raise QuantizationError(
                f"unknown algorithm {self.algo!r} for {self.mode}{why}; choose one of {', '.join(ALGOS[self.mode])}"
            )
        if self.calib_method not in CALIB_METHODS:
            raise QuantizationError(
                f"unknown calibration method {self.calib_method!r}; choose one of {', '.join(CALIB_METHODS)}"
            )
        b = self.block_size
        if b < 16 or b & (b - 1):
            raise QuantizationError(f"block size must be a power of two >= 16 (MatMulNBits), got {b}")
        for name in ("samples", "seq_len", "eval_tokens", "eval_window", "agreement_prompts", "agreement_tokens"):
            if getattr(self, name) < 1:
                raise QuantizationError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_bits not in (4, 8):
            raise QuantizationError(f"vocab bits must be 4 or 8, got {self.vocab_bits}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise QuantizationError(f"accuracy level must be 0-4 (MatMulNBits), got {self.accuracy_level}")
        if self.seq_len < 2 or self.prompt_tokens < 1 or self.decode_steps < 0:
            raise QuantizationError("need seq_len >= 2, prompt_tokens >= 1 and decode_steps >= 0")

    def _check_types(self) -> None:
        """Each field's value has its annotated type (a bool is not an int; numbers finite)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and "None" in str(f.type):
                continue
            kind = str(f.type).removesuffix(" | None")
            if kind == "int":
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif kind == "float":
                ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            elif kind == "bool":
                ok = isinstance(value, bool)
            elif kind == "str":
                ok = isinstance(value, str)
            else:  # tuple[str, ...]
                ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
            if not ok:
                raise QuantizationError(f"{f.name} must be of type {kind}, got {value!r}")
