"""Where the exported default model lives, for `hybridrt.load("default")`. Torch-free.

The package ships the default model as a Hugging Face checkpoint (hybridrt/data/default-model).
Its ONNX export is cached under the user's cache directory, keyed by a fingerprint of the
shipped files, the hybridrt version and the manifest schema, so it is rebuilt only when the
package's model or its exporter changes. Exporting needs the
`export` extra (`hybridrt demo` or `hybridrt export default`); loading the cache does not.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import GraphError

DEFAULT_NAME = "default"
CHECKPOINT_DIR = Path(__file__).resolve().parent.parent / "data" / "default-model"
FINGERPRINTED = ("config.json", "model.safetensors", "tokenizer.json")
OPTIONAL = ("generation_config.json",)  # hashed when present; absent, the key is unchanged


def cache_root() -> Path:
    """$HYBRIDRT_CACHE, else $XDG_CACHE_HOME/hybridrt, else ~/.cache/hybridrt."""
    if os.environ.get("HYBRIDRT_CACHE"):
        return Path(os.environ["HYBRIDRT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hybridrt"


def fingerprint() -> str:
    """sha256 over the shipped checkpoint's files, the hybridrt version and the manifest
    schema version (first 16 hex digits)."""
    from .. import __version__
    from ..graphs.manifest import SCHEMA_VERSION

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


def default_model_dir() -> Path:
    """The exported default model's directory; a clear error if it was never exported."""
    directory = cached_export_dir()
    if not (directory / "hybridrt.json").is_file():
        raise GraphError(
            f"the default model has not been exported yet (expected at {directory}); run `hybridrt demo` "
            "or `hybridrt export default -o DIR` on a machine with the export extra"
        )
    return directory
