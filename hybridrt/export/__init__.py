"""Export to ONNX, TorchScript and torch.export graphs (needs the `export` extra)."""

from .api import FORMATS, export

__all__ = ["FORMATS", "export"]
