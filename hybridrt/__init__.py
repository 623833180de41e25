"""hybridrt: export hybrid state-space/attention language models to ONNX and run them with
ONNX Runtime. Importing this package never imports torch."""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (
    CheckpointError,
    ExportError,
    GenerationError,
    GraphError,
    HybridrtError,
    ProviderError,
    UnsupportedArchitectureError,
)
from .runtime import load

__all__ = [
    "CheckpointError",
    "ExportError",
    "GenerationError",
    "GraphError",
    "HybridrtError",
    "ProviderError",
    "UnsupportedArchitectureError",
    "__version__",
    "export_model",
    "load",
]


def export_model(src, out, **kwargs):  # type: ignore[no-untyped-def]
    """Export a checkpoint directory to a graph directory (see hybridrt.export.export)."""
    from .export import export as _export

    return _export(src, out, **kwargs)
