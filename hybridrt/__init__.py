"""hybridrt: export hybrid state-space/attention language models to ONNX and run them with
ONNX Runtime. Importing this package never imports torch."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    CheckpointError,
    DeployError,
    ExportError,
    GenerationError,
    GenerationTimeout,
    GraphError,
    HybridrtError,
    ProviderError,
    QuantizationError,
    UnsupportedArchitectureError,
)
from .runtime import load

if TYPE_CHECKING:
    from .graphs.manifest import Manifest

__all__ = [
    "CheckpointError",
    "DeployError",
    "ExportError",
    "GenerationError",
    "GenerationTimeout",
    "GraphError",
    "HybridrtError",
    "ProviderError",
    "QuantizationError",
    "UnsupportedArchitectureError",
    "__version__",
    "export_model",
    "load",
]


def export_model(
    src: str | Path,
    out: str | Path,
    *,
    format: str = "onnx",
    force: bool = False,
    validate: bool = True,
    fused_ops: bool = True,
    fuse_norms: bool = True,
    progress: Callable[[str], None] | None = None,
    quantize: str | None = None,
    quantize_options: dict[str, Any] | None = None,
    eval_text: str | Path | None = None,
    layout: str = "hybridrt",
) -> Manifest:
    """Export a Hugging Face checkpoint directory (or "default", the shipped model) to a graph
    directory; returns its manifest. Needs the `export` extra.

    format: "onnx", "torchscript" or "pt2". force: replace an existing `out`. validate: check
    parity against PyTorch and refuse the export above tolerance. fused_ops: in ONNX, run each
    Mamba recurrence as one onnxruntime `com.microsoft` node; False keeps standard operators.
    fuse_norms: with fused_ops, fuse each RMSNorm (and the residual Add before it) into
    onnxruntime's SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization.
    progress: called with a line per stage. quantize: "int4", "int8-weight" or "int8-dynamic",
    each layer quantized as it is written (quantize_options: `quantize`'s options; eval_text:
    held-out text for the quality report against float). layout: "hybridrt" (the default) or
    "transformers-js", the directory transformers.js loads (docs/interop.md).
    """
    from .default_model import checkpoint_dir
    from .export.api import export

    quantizer = None if quantize is None else _quantizer(quantize, quantize_options, layout, src, format)
    if layout != "hybridrt":  # another runtime's directory around the export (hybridrt.interop)
        from .interop.layouts import export_layout

        inner = functools.partial(export, quantizer=quantizer)
        return export_layout(
            layout,
            checkpoint_dir(src),
            out,
            inner,
            format=format,
            force=force,
            validate=validate,
            progress=progress,
            quantized=quantizer is not None,
        )
    return export(
        checkpoint_dir(src),
        out,
        format=format,
        force=force,
        validate=validate,
        fused_ops=fused_ops,
        fuse_norms=fuse_norms,
        progress=progress,
        quantizer=quantizer,
        eval_text=eval_text,
    )


def _quantizer(mode: str, options: dict[str, Any] | None, layout: str, src: str | Path, format: str) -> Any:
    """The pass the export's streamed writer runs on each layer as it is written."""
    from .default_model import checkpoint_dir
    from .quantization.direct import FragmentQuantizer

    if layout != "hybridrt":
        from .interop.layouts import check_layout

        check_layout(layout, checkpoint_dir(src), format, quantized=True)
    return FragmentQuantizer(mode, **(options or {}))
