"""The model shipped inside the package, addressable as "default": everything hybridrt knows
about it lives here. Torch-free at import (exporting it imports the exporter on first use).

The package ships the default model as a Hugging Face checkpoint (hybridrt/data/default-model).
Its ONNX export is cached under the user's cache directory, keyed by a fingerprint of the
shipped files, the hybridrt version and the manifest schema, so it is rebuilt only when the
package's model or its exporter changes. Exporting needs the `export` extra (`hybridrt demo`
or `hybridrt export default`); loading the cache does not.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from ._version import __version__
from .errors import GraphError
from .graphs.manifest import MANIFEST, SCHEMA_VERSION

DEFAULT_NAME = "default"
CHECKPOINT_DIR = Path(__file__).resolve().parent / "data" / "default-model"
FINGERPRINTED = ("config.json", "model.safetensors", "tokenizer.json")
OPTIONAL = ("generation_config.json",)  # hashed when present; absent, the key is unchanged


def is_default(name: str | Path) -> bool:
    return str(name) == DEFAULT_NAME


def cache_root() -> Path:
    """$HYBRIDRT_CACHE, else $XDG_CACHE_HOME/hybridrt, else ~/.cache/hybridrt."""
    if os.environ.get("HYBRIDRT_CACHE"):
        return Path(os.environ["HYBRIDRT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hybridrt"


def fingerprint() -> str:
    """sha256 over the shipped checkpoint's files, the hybridrt version and the manifest
    schema version (first 16 hex digits)."""
    h = hashlib.sha256(f"hybridrt {__version__} schema {SCHEMA_VERSION}".encode())
    for name in FINGERPRINTED + OPTIONAL:
        path = CHECKPOINT_DIR / name
        if name in OPTIONAL and not path.is_file():
            continue
        if not path.is_file():
            raise GraphError(f"the default model is not installed: {path} is missing; reinstall hybridrt")
        h.update(name.encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def cached_export_dir() -> Path:
    return cache_root() / f"default-{fingerprint()}"


def checkpoint_dir(src: str | Path) -> Path:
    """A checkpoint directory, or the shipped checkpoint for the name "default"."""
    if is_default(src):
        fingerprint()  # a clear error if the package's model files are missing
        return CHECKPOINT_DIR
    from .errors import CheckpointError
    from .graphs.files import as_path

    return as_path(src, "the checkpoint directory", CheckpointError)


def exported_dir() -> Path:
    """The exported default model's directory; a clear error if it was never exported."""
    directory = cached_export_dir()
    if not (directory / MANIFEST).is_file():
        raise GraphError(
            f"the default model has not been exported yet (expected at {directory}); run `hybridrt demo` "
            "or `hybridrt export default -o DIR` on a machine with the export extra"
        )
    return directory


def ensure_exported(progress: Callable[[str], None] | None = None) -> tuple[Path, bool]:
    """The cached ONNX export of the default model, exporting it first if needed (needs the
    `export` extra). Returns (directory, exported_now)."""
    directory = cached_export_dir()
    if (directory / MANIFEST).is_file():
        return directory, False
    from .export.api import export

    export(CHECKPOINT_DIR, directory, force=True, progress=progress)
    return directory, True


def model_dir(name: str | Path, export: bool = False, progress: Callable[[str], None] | None = None) -> Path:
    """An exported directory, or the default model's for the name "default". With `export`,
    the default model is exported on first use where the export extra is installed."""
    if not is_default(name):
        return Path(name)
    if not export:
        return exported_dir()
    try:
        return exported_dir()
    except GraphError:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise  # the runtime-only install cannot export; exported_dir's message says how
        return ensure_exported(progress)[0]
