"""Helpers shared by subcommands."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import GraphError
from ..runtime.default import DEFAULT_NAME, default_model_dir


def stage(t0: float, message: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)


def model_dir(name: str) -> Path:
    """An exported directory; "default" exports the shipped model on first use (needs torch)."""
    if name != DEFAULT_NAME:
        return Path(name)
    try:
        return default_model_dir()
    except GraphError:
        try:
            from ..models.default import ensure_default_export
        except ImportError:
            raise  # the runtime-only install cannot export; default_model_dir's message says how
        t0 = time.perf_counter()
        directory, _ = ensure_default_export(lambda msg: stage(t0, f"default model: {msg}"))
        return directory
