"""The model shipped inside the package, addressable as "default"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..runtime.default import CHECKPOINT_DIR, DEFAULT_NAME, cached_export_dir, fingerprint

__all__ = ["CHECKPOINT_DIR", "DEFAULT_NAME", "ensure_default_export", "resolve_source"]


def resolve_source(src: str | Path) -> Path:
    """A checkpoint directory, or the shipped checkpoint for the name "default"."""
    if str(src) == DEFAULT_NAME:
        fingerprint()  # a clear error if the package's model files are missing
        return CHECKPOINT_DIR
    from ..errors import CheckpointError
    from ..runtime.validate import as_path

    return as_path(src, "the checkpoint directory", CheckpointError)


def ensure_default_export(progress: Callable[[str], None] | None = None) -> tuple[Path, bool]:
    """The cached ONNX export of the default model, exporting it first if needed.

    Returns (directory, exported_now).
    """
    from ..export import export

    directory = cached_export_dir()
    if (directory / "hybridrt.json").is_file():
        return directory, False
    export(DEFAULT_NAME, directory, force=True, progress=progress)
    return directory, True
