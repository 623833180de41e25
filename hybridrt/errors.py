"""Typed errors. Each message names the problem and, where there is one, the fix."""

from __future__ import annotations


class HybridrtError(Exception):
    """Base class of every error hybridrt raises on purpose."""


class UnsupportedArchitectureError(HybridrtError):
    """The checkpoint's `model_type` (or one of its config fields) is not supported."""


class CheckpointError(HybridrtError):
    """A checkpoint directory is missing files, is corrupt, or does not match its config."""


class ExportError(HybridrtError):
    """Export failed: the output exists, tracing failed, or parity is above tolerance."""


class GraphError(HybridrtError):
    """An exported directory is corrupt or does not match its manifest."""


class ProviderError(HybridrtError):
    """A requested execution provider is not available in this onnxruntime build."""


class QuantizationError(HybridrtError):
    """Quantization cannot run or its result failed a quality gate; nothing was written."""


class DeployError(HybridrtError):
    """A deployment artifact (a Triton model repository) cannot be made for this model or these
    settings; nothing was written."""


class GenerationError(HybridrtError, ValueError):
    """Invalid generation input: sampling parameters, prompt length, missing tokenizer."""


class GenerationTimeout(GenerationError):
    """A generate() or stream() call passed its `timeout`: it stopped after the step that
    crossed the deadline. `stats` holds what it did (stats.tokens: the tokens so far); the
    model, and a chat session's states, stay usable."""

    def __init__(self, message: str, stats: object = None) -> None:
        super().__init__(message)
        self.stats = stats
