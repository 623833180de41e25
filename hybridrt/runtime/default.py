"""Where the exported default model lives, for `hybridrt.load("default")`. Torch-free.

TODO(default model): not implemented yet. Once the default model is exported and cached,
this returns the directory holding its model.onnx and hybridrt.json.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import GraphError

DEFAULT_NAME = "default"


def default_model_dir() -> Path:
    """The exported default model's directory. Stub until the default model is exported."""
    raise GraphError("the default model is not available yet")
