"""A Hugging Face model id as an export source: `hybridrt export ibm-granite/granite-4.0-h-1b -o OUT`.

The id resolves through huggingface_hub's snapshot cache: with HF_HUB_OFFLINE=1 only what is
already cached (nothing is downloaded), otherwise the hub fills the cache first. Only the
files export reads are fetched: config and generation config, the safetensors shards and
their index, the tokenizer.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import CheckpointError

PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]
_MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve(src: str | Path) -> Path:
    """`src` as a directory: itself when it exists or is not shaped like a model id, else the
    snapshot of that model in the Hugging Face cache."""
    path = Path(src)
    if path.exists() or not _MODEL_ID.match(str(src)):
        return path
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            f"{src} is not a directory; to read a Hugging Face model id, install huggingface_hub"
        ) from None
    try:
        return Path(snapshot_download(str(src), allow_patterns=PATTERNS))
    except Exception as e:  # offline cache miss, unknown repository, no network
        raise CheckpointError(
            f"{src} is neither a checkpoint directory nor a model id found in the Hugging Face cache "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); download it first "
            "(huggingface-cli download ...) or pass the directory"
        ) from None
