"""Where export and quantize write: a temporary directory beside the output, renamed into
place at the end, so a failed run leaves nothing behind. Torch-free."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..errors import HybridrtError


def temporary_beside(out: Path, error: type[HybridrtError]) -> Path:
    """A temporary directory in `out`'s parent (created if need be); `error` if it cannot be."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:
        raise error(
            f"cannot write beside {out}: {e.strerror} ({e.filename}); choose another output directory"
        ) from None
