"""The model shipped inside the package, addressable as "default"."""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError

DEFAULT_NAME = "default"
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "data" / "default-model"


def resolve_source(src: str | Path) -> Path:
    """A checkpoint directory, or the shipped model for the name "default"."""
    if str(src) == DEFAULT_NAME:
        if not (DEFAULT_DIR / "config.json").is_file():
            raise CheckpointError(f"the default model is not installed at {DEFAULT_DIR}")
        return DEFAULT_DIR
    return Path(src)
